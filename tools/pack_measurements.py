"""Pack committed raw measurements in place (:mod:`kvsim.calibration.packed`), checking each.

    python3 tools/pack_measurements.py FILE...

``results.json`` / ``results.json.gz`` (a hardware run's results) becomes ``results.json.xz``
with its calls as columns: read back, it must equal the original exactly. A GIL benchmark
``*.jsonl`` / ``*.jsonl.gz`` becomes ``*.jsonl.xz`` with nanosecond times: read back, every time
must be within half a nanosecond of the original (:data:`NS_TOLERANCE_S`; the times are
``perf_counter`` differences, whole nanoseconds only on a host up for a short while: after days
of uptime a difference carries ~1e-10 s of float quantization, which the rounding drops).
Any other ``*.json`` / ``*.json.gz`` (calibration samples) becomes ``*.json.xz``, exact. The
original is removed only once its packed form checks out.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

from kvsim.calibration.packed import XZ, pack_results, pack_runs, read_json, read_lines

# What rounding to whole nanoseconds may move a time by, with room for float error.
NS_TOLERANCE_S = 0.5e-9 + 1e-12


def _stem(path: Path) -> Path:
    return path.with_suffix("") if path.suffix in (".gz", ".xz") else path


def pack(path: Path) -> Path:
    base = _stem(path)
    dest = base.with_name(base.name + ".xz")
    if base.suffix == ".jsonl":
        runs = read_lines(path)
        dest.write_bytes(pack_runs(runs))
        back = read_lines(dest)
        assert len(back) == len(runs)
        for a, b in zip(runs, back):
            assert {k: v for k, v in a.items() if k != "calls"} == \
                   {k: v for k, v in b.items() if k != "calls"}
            assert all(x[0] == y[0] and abs(x[1] - y[1]) <= NS_TOLERANCE_S
                       and abs(x[2] - y[2]) <= NS_TOLERANCE_S
                       for x, y in zip(a["calls"], b["calls"])) and len(a["calls"]) == len(b["calls"])
    else:
        obj = read_json(path)
        if base.name == "results.json":
            dest.write_bytes(pack_results(obj))
        else:
            dest.write_bytes(lzma.compress(json.dumps(obj, sort_keys=True,
                                                      separators=(",", ":")).encode(), preset=XZ))
        assert read_json(dest) == obj, f"{dest} does not read back as {path}"
    if dest != path:
        path.unlink()
    return dest


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        path = Path(name)
        before = path.stat().st_size
        dest = pack(path)
        print(f"{path}: {before} -> {dest.stat().st_size} bytes ({dest.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
