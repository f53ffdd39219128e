"""An engine-times file with a first-run-per-shape cost, from a repeated replay (a what-if).

``tools/replay_serving_prefills.py --repeat 2`` runs a serving run's prefills twice in one
process; the second round meets every shape again. The median, over passes, of (first round -
second round) / prefills in the pass is the cost of a shape's first run. This writes a copy of
an engine-times file with that figure as the architecture's ``cold_shape_ms``
(:mod:`kvsim.llm.engine_time`), naming the replay it came from.

    python tools/cold_shape_whatif.py REPLAY.json[.xz] ENGINE.json ARCH --out WHATIF.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvsim.calibration.packed import read_json  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tools/cold_shape_whatif.py")
    ap.add_argument("replay")
    ap.add_argument("engine")
    ap.add_argument("architecture")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    passes = read_json(args.replay)["passes"]
    if not passes or "replay_2_ms" not in passes[0]:
        print(f"{args.replay}: no second round (run the replay with --repeat 2)", file=sys.stderr)
        return 2
    per = [(p["replay_ms"] - p["replay_2_ms"]) / len(p["prefills"]) for p in passes if p["prefills"]]
    cold = statistics.median(per)
    doc = json.loads(Path(args.engine).read_text())
    entry = doc["architectures"][args.architecture]
    entry["cold_shape_ms"] = round(cold, 3)
    doc["source"] += (f"; cold_shape_ms: median over {len(per)} passes of (first - second round) "
                      f"per prefill, {args.replay} (a what-if, not a fit)")
    Path(args.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"cold_shape_ms {cold:.3f} from {len(per)} passes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
