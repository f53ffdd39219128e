"""PROTOCOL-3's rule: the call's fitted CPU preset plus the terms its own benchmarks measured
(reports/validation-h200/concurrency/PROTOCOL-3.md), written as two presets.

* ``A`` (judged): the fitted preset (``tools/gil_fields_from_samples.py``'s output), plus
  ``after_sleep_us`` = [[S, excess(S)], ...] for each sleep S of ``tools/probe_after_sleep.py``
  (its ``excess_over_back_to_back_us``), ``lock_test_us`` and ``lock_wake_us`` from
  ``tools/lock_wake_bench.py``'s ``derived``, and ``sleep_retakes_gil`` true;
* ``B`` (judged beside it, reported, not the verdict): A plus ``lock_mutex`` true and
  ``lock_release_us`` from the lock bench.

    python3 tools/concurrency_preset3.py FITTED.json AFTER_SLEEP.json LOCK_BENCH.json A.json B.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(fitted: dict, after_sleep: dict, bench: dict, where: dict[str, str]) -> tuple[dict, dict]:
    a = dict(fitted)
    a["name"] = f"{fitted.get('name', 'preset')}-p3"
    a["description"] = (str(fitted.get("description", "")) + " PROTOCOL-3 preset A: plus the "
                        "after-sleep, lock-test and lock-wake terms of the same call's benchmarks "
                        "and sleep_retakes_gil (tools/concurrency_preset3.py).")
    pts = [[float(c["sleep_us"]), round(float(c["excess_over_back_to_back_us"]), 2)]
           for c in after_sleep["conditions"] if c["sleep_us"] > 0]
    a["after_sleep_us"] = {"value": pts, "source": f"{where['after_sleep']}: tools/probe_after_sleep.py, "
                           "median probe_reuse after time.sleep(S) less back to back"}
    d = bench["derived"]
    for key in ("lock_test_us", "lock_wake_us"):
        a[key] = {"value": d[key], "source": f"{where['bench']}: tools/lock_wake_bench.py derived.{key} "
                  f"({d['rule']})"}
    a["sleep_retakes_gil"] = {"value": True, "source": "CPython: time.sleep returns holding the "
                              "GIL (PROTOCOL-3.md, design A)"}
    b = dict(a)
    b["name"] = f"{fitted.get('name', 'preset')}-p3-mutex"
    b["description"] = a["description"].replace("preset A", "preset B (A with the Condition's mutex)")
    b["lock_mutex"] = {"value": True, "source": "hw.rwlock's threading.Condition mutex "
                       "(PROTOCOL-3.md, design B)"}
    b["lock_release_us"] = {"value": d["lock_release_us"], "source": f"{where['bench']}: "
                            "tools/lock_wake_bench.py derived.lock_release_us"}
    return a, b


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 5:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    fitted, sleep, bench, out_a, out_b = (Path(p) for p in argv)
    from kvsim.calibration.packed import read_json  # plain or .xz

    a, b = build(read_json(fitted), read_json(sleep), read_json(bench),
                 {"after_sleep": str(sleep), "bench": str(bench)})
    out_a.write_text(json.dumps(a, indent=1) + "\n")
    out_b.write_text(json.dumps(b, indent=1) + "\n")
    print(f"wrote {out_a} and {out_b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
