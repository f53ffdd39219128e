"""Add a CPU preset's ``call_cpu_spread`` from GIL benchmark runs (what-if 7; design S of
reports/validation-h200/concurrency/PROTOCOL-5.md; no shipped preset has it).

    python3 tools/call_spread_from_bench.py PRESET.json OUT.json BENCH.jsonl[.gz|.xz] ...

Writes PRESET with ``call_cpu_spread`` (kvsim.calibration.host_speed.call_spread over the runs,
priced with PRESET as loaded without its host speed factor) to OUT, and prints the table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvsim.calibration import gil_handover as gh
from kvsim.calibration import host_speed
from kvsim.calibration.packed import read_lines
from kvsim.model.cpu_cost import cpu_model_from_dict


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    preset_file, out, bench = Path(argv[0]), Path(argv[1]), argv[2:]
    preset = json.loads(preset_file.read_text())
    unstretched = {k: v for k, v in preset.items() if k != "host_speed_factor"}
    runs = gh.runs_from_json([run for f in bench for run in read_lines(f)])
    spread = host_speed.call_spread(cpu_model_from_dict(unstretched, preset_file), runs)
    preset["call_cpu_spread"] = host_speed.spread_field(spread, ", ".join(bench))
    out.write_text(json.dumps(preset, indent=1) + "\n")
    print(json.dumps(spread))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
