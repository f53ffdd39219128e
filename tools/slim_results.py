"""Copy hardware-run results directories keeping what ``kvsim validate`` reads: every call with
its times (to 0.1 us), lock times, CPU and copy figures (not its arguments or per-unit counts),
and every top-level section. For committing many runs (a probe run's results.json is ~4 MB, ~0.2 MB slim
and gzipped).

    python3 tools/slim_results.py DEST RUN_DIR...

Each run lands in DEST under its path below the runs' common folder (one run: its own name).
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvsim.calibration.packed import slim_calls  # noqa: E402


def slim(run_dir: Path, dest: Path) -> None:
    data = json.loads((run_dir / "results.json").read_text())
    data["calls"] = slim_calls(data["calls"])
    dest.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, sort_keys=True).encode()
    (dest / "results.json.gz").write_bytes(gzip.compress(text, mtime=0))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0])
    runs = [Path(d).resolve() for d in argv[1:]]
    for d, name in zip(runs, destinations(runs)):
        slim(d, dest / name)
    return 0


def destinations(runs: list[Path]) -> list[Path]:
    """Where each run goes under DEST: its path below the runs' common folder (its own name when
    there is one run), so that ``a/variants/buggy`` and ``b/variants/buggy`` stay apart."""
    if len(runs) == 1:
        return [Path(runs[0].name)]
    common = Path(os.path.commonpath(runs))
    names = [r.relative_to(common) if r != common else Path(r.name) for r in runs]
    if len(set(names)) < len(names):
        raise SystemExit("slim_results: the same run directory is given twice")
    return names


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
