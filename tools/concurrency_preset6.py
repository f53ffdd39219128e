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

With ``--first-test-from MEASURED:CASE[,CASE...]`` as well (PROTOCOL-8's design E),
``lock_first_test_us`` is the judged writers' own first acquisition instead of the bench's
fresh thread: the median, over those cases' runs under ``MEASURED/v``, of results.json's
``starvation.longest_writer_wait_ms`` (one-call writer threads that find the lock free wait
exactly their first test; call 5's what-if 11 took it from probe_starvation's runs). The cases
named are then a fit role, not held out.

    python3 tools/concurrency_preset6.py [--speed-from-spread] [--first-test-from M:CASES] \\
        A.json LOCK_BENCH.json OUT.json SPREAD_BENCH.jsonl[.xz]...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from kvsim.calibration import concurrency_judge as cj
from kvsim.calibration import gil_handover as gh
from kvsim.calibration import host_speed
from kvsim.calibration.packed import read_json
from kvsim.errors import KvsimError

LOCK_TERMS = ("lock_test_us", "lock_wake_us", "lock_first_test_us")


def build(a: dict, bench: dict, bench_file: str, spread: dict | None, spread_files: str,
          design: str = "c", first_test: tuple[float, str] | None = None) -> dict:
    """Design C (or D, whose ``a`` carries the speed of the spread's runs) from preset ``a``,
    the lock bench's JSON and (if given) a spread table; with ``first_test`` (value in us, its
    source), that is ``lock_first_test_us`` instead of the bench's (design E)."""
    c = dict(a)
    c["name"] = f"{a.get('name', 'preset')}-{design}"
    c["description"] = (str(a.get("description", "")) + " PROTOCOL-6 design C: plus a thread's "
                        "first lock test, the lock terms at the judged runs' speed and the "
                        "spread of one-thread-at-a-time probes (tools/concurrency_preset6.py).")
    d = bench.get("derived")
    if not isinstance(d, dict):
        raise ValueError(f"{bench_file}: derived: missing (not a tools/lock_wake_bench.py "
                         "output)")
    if first_test is not None:
        c["lock_first_test_us"] = {"value": first_test[0], "source": first_test[1]}
        c["description"] += (" PROTOCOL-8 design E: a thread's first lock test from the judged "
                             "writers' own waits in the fit-role cases.")
    elif "lock_first_test_us" not in d:
        raise ValueError(f"{bench_file}: derived.lock_first_test_us: missing (a lock bench "
                         "without the 'first' condition)")
    else:
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


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None


def writer_first_test_us(spec: str) -> tuple[float, str]:
    """``MEASURED:CASE[,CASE...]``: the median of those cases' runs' longest writer wait, in us,
    and where it came from."""
    measured, _, names = spec.rpartition(":")
    cases = [n for n in names.split(",") if n]
    if not measured or not cases:
        raise ValueError(f"--first-test-from {spec!r}: expected MEASURED_DIR:CASE[,CASE...]")
    try:
        _, runs, _ = cj.load_runs(Path(measured))
    except KvsimError as e:
        raise ValueError(f"--first-test-from: {e}") from None
    waits = []
    for name in cases:
        if name not in runs:
            raise ValueError(f"--first-test-from: {measured}/v has no runs of {name!r} (it has "
                             f"{', '.join(sorted(runs))})")
        waits += [wait for r in runs[name] if r.status == "ok" and (wait := (
            r.results.get("starvation") or {}).get("longest_writer_wait_ms")) is not None]
    if not waits:
        raise ValueError(f"--first-test-from: no writer wait in the ok runs of {', '.join(cases)}")
    value = round(statistics.median(waits) * 1e3, 3)
    return value, (f"{measured}/v {', '.join(cases)}: median of {len(waits)} runs' results.json "
                   "starvation.longest_writer_wait_ms (tools/concurrency_preset6.py "
                   "--first-test-from)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset_a", type=Path)
    ap.add_argument("lock_bench", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("spread_bench", nargs="+", help="one-thread-at-a-time benchmark runs")
    ap.add_argument("--speed-from-spread", action="store_true",
                    help="the host speed factor from the same runs (design D)")
    ap.add_argument("--first-test-from", metavar="MEASURED:CASE[,CASE...]",
                    help="lock_first_test_us from those cases' writer waits (design E)")
    args = ap.parse_args(argv)
    if args.first_test_from and not args.speed_from_spread:
        ap.error("--first-test-from is design E, design D's terms plus it: give "
                 "--speed-from-spread too")
    design = "e" if args.first_test_from else "d" if args.speed_from_spread else "c"
    try:  # every input read and checked before the output is written
        a = _json(args.preset_a)
        runs = gh.read_runs(args.spread_bench)
        cpu = host_speed.unstretched(a, args.preset_a)
        spread = host_speed.call_spread(cpu, runs)
        if args.speed_from_spread:
            a["host_speed_factor"] = host_speed.preset_field(host_speed.factor(cpu, runs),
                                                             ", ".join(args.spread_bench))
        first = writer_first_test_us(args.first_test_from) if args.first_test_from else None
        c = build(a, read_json(args.lock_bench), str(args.lock_bench), spread,
                  ", ".join(args.spread_bench), design, first)
    except (OSError, ValueError, KvsimError) as e:
        print(f"concurrency_preset6.py: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(c, indent=1) + "\n")
    print(json.dumps({k: c[k]["value"] for k in LOCK_TERMS if k in c} | {"spread": spread}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
