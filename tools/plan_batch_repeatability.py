"""How well does a plan-batch point's median repeat within its own run? A floor for the copy model.

    python tools/plan_batch_repeatability.py \
        reports/validation-h200/plan-batches/2026-12-04-plan-batches-3.json.xz

For every fixed-path point of the judge-role batches (its end-to-end ``cuda_events_issue``
record, the judged figure), its timed samples (``samples_ms``, in the order they were taken) are
split in two ways and the two halves' medians compared, as absolute percentage error of the
first against the second:

* **time split** -- the first half of the samples against the second (the host's slow and fast
  spells between them count, as they do between a model's fit and a later measurement);
* **interleaved** -- even against odd samples (the same spells in both: sampling noise alone).

Two independent halves differ by about sqrt(2) times a half median's error, and the full median
is about sqrt(2) less noisy than a half: so a model that priced every point at its true value
would still be judged off by roughly half these figures, from the measurement alone. Prints
median and 90th percentile over the points, all and split at 1 ms.
"""

from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path

import numpy as np


def _load(path: Path) -> dict:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def repeatability(measurement: dict) -> dict:
    rows = [r for r in measurement["records"]
            if r.get("status") == "ok" and r["params"].get("role") == "judge"
            and r.get("timing") == "cuda_events_issue"
            and r["path"] != "select" and len(r.get("samples_ms") or []) >= 4]
    out: dict = {"points": len(rows)}
    for name, split in (("time_split", lambda s: (s[: s.size // 2], s[s.size // 2:])),
                        ("interleaved", lambda s: (s[::2], s[1::2]))):
        err, small = [], []
        for r in rows:
            s = np.asarray(r["samples_ms"], dtype=float)
            a, b = split(s)
            err.append(abs(np.median(a) - np.median(b)) / np.median(b) * 100)
            small.append(np.median(s) < 1.0)
        e, sm = np.asarray(err), np.asarray(small)
        out[name] = {group: {"points": int(v.size), "median_ape_pct": float(np.median(v)),
                             "p90_ape_pct": float(np.percentile(v, 90))}
                     for group, v in (("all", e), ("under_1ms", e[sm]), ("from_1ms", e[~sm]))
                     if v.size}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("measurement", type=Path)
    args = ap.parse_args()
    rep = repeatability(_load(args.measurement))
    print(f"{rep['points']} judge-role fixed-path points of {args.measurement}")
    for name in ("time_split", "interleaved"):
        for group, s in rep[name].items():
            print(f"{name:<12} {group:<10} {s['points']:5d} points: median {s['median_ape_pct']:5.2f} %, "
                  f"p90 {s['p90_ape_pct']:5.2f} %")


if __name__ == "__main__":
    main()
