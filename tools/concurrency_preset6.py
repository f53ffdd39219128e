"""PROTOCOL-6's design C: preset A (tools/concurrency_preset3.py) plus the three terms the
diagnostics after call 5 measured (reports/validation-h200/concurrency/README.md, "Call 5"):

* ``lock_first_test_us``: the lock bench's ``derived.lock_first_test_us`` (a fresh thread's first
  acquisition of a free lock, tools/lock_wake_bench.py's ``first`` condition);
* the lock terms at the judged runs' speed: ``lock_test_us``, ``lock_wake_us`` and
  ``lock_first_test_us`` are timed by the lock bench in the same device call as the judged runs,
  so they are stored divided by the preset's ``host_speed_factor`` (the loader stretches every
  host cost by it, which then gives them back as measured);
* ``call_cpu_spread`` from benchmark runs whose threads run one at a time, as the judged closed
  loops do (tools/gil_bench_runs.py ``--probes 400``), by kvsim.calibration.host_speed.call_spread.

With ``--speed-from-spread`` (PROTOCOL-7's design D) the preset's ``host_speed_factor`` is first
replaced by kvsim.calibration.host_speed.factor over the same one-thread-at-a-time runs (their
median probe against its modelled price), instead of the contending GIL benchmark pairs' (call 6
and its what-if 12, reports/validation-h200/concurrency/README.md).

    python3 tools/concurrency_preset6.py [--speed-from-spread] A.json LOCK_BENCH.json OUT.json \\
        SPREAD_BENCH.jsonl[.xz]...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvsim.calibration import gil_handover as gh
from kvsim.calibration import host_speed
from kvsim.calibration.packed import read_json

LOCK_TERMS = ("lock_test_us", "lock_wake_us", "lock_first_test_us")


def build(a: dict, bench: dict, bench_file: str, spread: dict | None, spread_files: str,
          design: str = "c") -> dict:
    """Design C (or D, whose ``a`` carries the speed of the spread's runs) from preset ``a``,
    the lock bench's JSON and (if given) a spread table."""
    c = dict(a)
    c["name"] = f"{a.get('name', 'preset')}-{design}"
    c["description"] = (str(a.get("description", "")) + " PROTOCOL-6 design C: plus a thread's "
                        "first lock test, the lock terms at the judged runs' speed and the "
                        "spread of one-thread-at-a-time probes (tools/concurrency_preset6.py).")
    d = bench["derived"]
    if "lock_first_test_us" not in d:
        raise ValueError(f"{bench_file}: derived.lock_first_test_us: missing (a lock bench "
                         "without the 'first' condition)")
    c["lock_first_test_us"] = {"value": d["lock_first_test_us"],
                               "source": f"{bench_file}: tools/lock_wake_bench.py "
                                         "derived.lock_first_test_us"}
    speed = a.get("host_speed_factor", {"value": 1.0})
    factor = float(speed["value"] if isinstance(speed, dict) else speed)
    for key in LOCK_TERMS:
        if key in c:
            term = dict(c[key])
            term["value"] = round(float(term["value"]) / factor, 4)
            term["source"] = (f"{term['source']}; divided by host_speed_factor {factor} (timed in "
                              "the judged runs' call: the loader's stretch gives it back)")
            c[key] = term
    if spread is not None:
        c["call_cpu_spread"] = host_speed.spread_field(spread, spread_files)
    return c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset_a", type=Path)
    ap.add_argument("lock_bench", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("spread_bench", nargs="+", help="one-thread-at-a-time benchmark runs")
    ap.add_argument("--speed-from-spread", action="store_true",
                    help="the host speed factor from the same runs (design D)")
    args = ap.parse_args(argv)
    a = json.loads(args.preset_a.read_text())
    runs = gh.read_runs(args.spread_bench)
    cpu = host_speed.unstretched(a, args.preset_a)
    spread = host_speed.call_spread(cpu, runs)
    if args.speed_from_spread:
        a["host_speed_factor"] = host_speed.preset_field(host_speed.factor(cpu, runs),
                                                         ", ".join(args.spread_bench))
    try:
        c = build(a, read_json(args.lock_bench), str(args.lock_bench), spread,
                  ", ".join(args.spread_bench), "d" if args.speed_from_spread else "c")
    except ValueError as e:
        print(f"concurrency_preset6.py: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(c, indent=1) + "\n")
    print(json.dumps({k: c[k]["value"] for k in LOCK_TERMS if k in c} | {"spread": spread}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
