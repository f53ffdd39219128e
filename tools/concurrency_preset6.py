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

With ``--after-sleep-from MEASURED:CLOSED,SLEEPING[,SLEEPING...]`` as well (PROTOCOL-10's design
F), the preset gets ``after_sleep_factor``: for each sleeping case, at its probe interval, its
probe p50 (every probe_reuse latency of its ok runs pooled, as the judge's) over the closed
loop's. The sleeping loops' probes run about twice as long as the closed loops' on every part
(manager CPU, lock test, Python edges: the call records of call 9), which a woken thread's cold
caches explain and a constant extra does not. Those cases' probe figures are then a fit role.
The factor is the judged loops' whole after-sleep ratio, so the preset's ``after_sleep_us``
(the one-thread bench's constant, tools/probe_after_sleep.py) is dropped: kept, it was counted
twice and stretched by the factor as well (call 11, README "Call 11": +52 us at 2000 us on that
host made the sleeping loops +104 to +114 %).

With ``--submit-gil-free-from SHARE.json`` as well (PROTOCOL-11's design G), the preset gets
``copy_submit_gil_free``: the pooled share of the copy submission spent in CUDA calls that
release the GIL, as ``tools/copy_submit_gil_share.py`` measured it (refused if that run's
controls were not told apart).

With ``--no-call-costs`` the preset drops ``api_call_us`` and ``unit_us.eviction_rounds``
(which ``kvsim calibrate`` writes since design H, kvsim.calibration.api_costs): every call then
takes ``per_call_us``, as the designs before H priced them.

    python3 tools/concurrency_preset6.py [--speed-from-spread] [--first-test-from M:CASES] \\
        [--after-sleep-from M:CLOSED,SLEEPING...] [--submit-gil-free-from SHARE.json] \\
        [--no-call-costs] A.json LOCK_BENCH.json OUT.json SPREAD_BENCH.jsonl[.xz]...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from kvsim.calibration import concurrency_judge as cj
from kvsim.calibration import gil_handover as gh
from kvsim.calibration import host_speed
from kvsim.calibration.packed import read_json
from kvsim.calibration.validate import _probes
from kvsim.errors import KvsimError

LOCK_TERMS = ("lock_test_us", "lock_wake_us", "lock_first_test_us")


def build(a: dict, bench: dict, bench_file: str, spread: dict | None, spread_files: str,
          design: str = "c", first_test: tuple[float, str] | None = None,
          after_sleep: tuple[list[list[float]], str] | None = None,
          submit_free: tuple[float, str] | None = None) -> dict:
    """Design C (or D, whose ``a`` carries the speed of the spread's runs) from preset ``a``,
    the lock bench's JSON and (if given) a spread table; with ``first_test`` (value in us, its
    source), that is ``lock_first_test_us`` instead of the bench's (design E); with
    ``after_sleep`` (points, source) as well, that is ``after_sleep_factor`` (design F); with
    ``submit_free`` (share, source) as well, that is ``copy_submit_gil_free`` (design G)."""
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
    if after_sleep is not None:
        c["after_sleep_factor"] = {"value": after_sleep[0], "source": after_sleep[1]}
        c.pop("after_sleep_us", None)  # held in the factor (see the module docstring)
        c["description"] += (" PROTOCOL-10 design F: the call after a sleep runs slower by the "
                             "judged sleeping loops' probe p50 over the closed loop's.")
    if submit_free is not None:
        c["copy_submit_gil_free"] = {"value": submit_free[0], "source": submit_free[1]}
        c["description"] += (" PROTOCOL-11 design G: the measured share of the copy submission "
                             "that runs without the GIL.")
    if spread is not None:
        c["call_cpu_spread"] = host_speed.spread_field(spread, spread_files)
    return c


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None


def _case_runs(spec: str, flag: str) -> tuple[str, dict[str, list]]:
    """``MEASURED:CASE[,CASE...]``: the directory and each named case's ok runs, in order."""
    measured, _, names = spec.rpartition(":")
    cases = [n for n in names.split(",") if n]
    if not measured or not cases:
        raise ValueError(f"{flag} {spec!r}: expected MEASURED_DIR:CASE[,CASE...]")
    if len(set(cases)) != len(cases):
        raise ValueError(f"{flag} {spec!r}: a case named twice")
    try:
        _, runs, _ = cj.load_runs(Path(measured))
    except KvsimError as e:
        raise ValueError(f"{flag}: {e}") from None
    out = {}
    for name in cases:
        if name not in runs:
            raise ValueError(f"{flag}: {measured}/v has no runs of {name!r} (it has "
                             f"{', '.join(sorted(runs))})")
        out[name] = [r for r in runs[name] if r.status == "ok"]
    return measured, out


def writer_first_test_us(spec: str) -> tuple[float, str]:
    """``MEASURED:CASE[,CASE...]``: the median of those cases' runs' longest writer wait, in us,
    and where it came from."""
    measured, runs = _case_runs(spec, "--first-test-from")
    waits = [wait for rs in runs.values() for r in rs if (wait := (
        r.results.get("starvation") or {}).get("longest_writer_wait_ms")) is not None]
    if not waits:
        raise ValueError(f"--first-test-from: no writer wait in the ok runs of {', '.join(runs)}")
    value = round(statistics.median(waits) * 1e3, 3)
    return value, (f"{measured}/v {', '.join(runs)}: median of {len(waits)} runs' results.json "
                   "starvation.longest_writer_wait_ms (tools/concurrency_preset6.py "
                   "--first-test-from)")


def _pooled_p50_ms(name: str, runs: list) -> float:
    """The judge's probe p50: every probe_reuse latency of the runs pooled, numpy's median."""
    probes = [x for r in runs for x in _probes(r.results, None)]
    if not probes:
        raise ValueError(f"--after-sleep-from: no probe in the ok runs of {name}")
    return float(np.quantile(probes, 0.5))


def _interval_us(name: str, runs: list) -> float:
    """The probe interval (results.json resolved.workload.probe_interval_us) the runs share."""
    seen = {float(((r.results.get("resolved") or {}).get("workload") or {})
                  .get("probe_interval_us", -1.0)) for r in runs}
    if len(seen) != 1 or min(seen) < 0:
        raise ValueError(f"--after-sleep-from: {name}: its runs give no single "
                         f"resolved.workload.probe_interval_us ({sorted(seen)})")
    return seen.pop()


def after_sleep_factor(spec: str) -> tuple[list[list[float]], str]:
    """``MEASURED:CLOSED,SLEEPING[,SLEEPING...]``: ``after_sleep_factor``'s points, one per
    sleeping case at its probe interval: its pooled probe p50 over the closed loop's (interval
    0, the same workload otherwise), and where they came from."""
    measured, runs = _case_runs(spec, "--after-sleep-from")
    (closed, closed_runs), *sleeping = runs.items()
    if not sleeping:
        raise ValueError("--after-sleep-from: name the closed loop, then the sleeping loops")
    if _interval_us(closed, closed_runs) != 0.0:
        raise ValueError(f"--after-sleep-from: {closed}: the first case must be a closed loop "
                         "(probe_interval_us 0)")
    base = _pooled_p50_ms(closed, closed_runs)
    points: dict[float, float] = {}
    for name, rs in sleeping:
        interval = _interval_us(name, rs)
        if interval <= 0 or interval in points:
            raise ValueError(f"--after-sleep-from: {name}: probe_interval_us {interval:g} is "
                             "not a new sleep (> 0, one case per interval)")
        points[interval] = round(_pooled_p50_ms(name, rs) / base, 4)
    return [[t, points[t]] for t in sorted(points)], (
        f"{measured}/v: pooled probe_reuse latency p50 of {', '.join(n for n, _ in sleeping)} "
        f"over {closed}'s ({base * 1e3:.2f} us), at each one's probe_interval_us "
        "(tools/concurrency_preset6.py --after-sleep-from)")


def without_call_costs(preset: dict) -> dict:
    """``preset`` without design H's per-method costs: every call takes ``per_call_us``."""
    out = {k: v for k, v in preset.items() if k != "api_call_us"}
    out["unit_us"] = {k: v for k, v in preset.get("unit_us", {}).items() if k != "eviction_rounds"}
    out["name"] = f"{preset.get('name', 'preset')}-no-call-costs"
    return out


def submit_gil_free(path: Path) -> tuple[float, str]:
    """``copy_submit_gil_free`` from a ``tools/copy_submit_gil_share.py`` output: its pooled
    share, and where it came from; refused if that run's GIL-release controls failed."""
    d = read_json(path)
    method = str(d.get("gil_release", {}).get("method", "not checked"))
    if not method.startswith("ok"):
        raise ValueError(f"{path}: gil_release.method: {method} (a share is taken only from a "
                         "run whose controls were told apart)")
    pooled = d.get("pooled", {})
    value = pooled.get("share")
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{path}: pooled.share: a share, 0 to 1, got {value!r}")
    m = d.get("machine", {})
    return round(float(value), 4), (
        f"{path}: tools/copy_submit_gil_share.py pooled share over {pooled.get('batches')} "
        f"batch submissions of {d.get('scenario')} ({m.get('gpu')}, driver {m.get('driver')}, "
        f"{d.get('when')}); CUDA calls' time less the uploads' allocations over enqueue time, "
        "an upper bound (their argument conversion holds the GIL)")


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
    ap.add_argument("--after-sleep-from", metavar="MEASURED:CLOSED,SLEEPING[,...]",
                    help="after_sleep_factor from those cases' probe p50s (design F)")
    ap.add_argument("--submit-gil-free-from", metavar="SHARE.json", type=Path,
                    help="copy_submit_gil_free from tools/copy_submit_gil_share.py (design G)")
    ap.add_argument("--no-call-costs", action="store_true",
                    help="drop api_call_us and unit_us.eviction_rounds (per_call_us for every call)")
    args = ap.parse_args(argv)
    if args.first_test_from and not args.speed_from_spread:
        ap.error("--first-test-from is design E, design D's terms plus it: give "
                 "--speed-from-spread too")
    if args.after_sleep_from and not args.first_test_from:
        ap.error("--after-sleep-from is design F, design E's terms plus it: give "
                 "--first-test-from too")
    if args.submit_gil_free_from and not args.after_sleep_from:
        ap.error("--submit-gil-free-from is design G, design F's terms plus it: give "
                 "--after-sleep-from too")
    design = ("g" if args.submit_gil_free_from else "f" if args.after_sleep_from
              else "e" if args.first_test_from else "d" if args.speed_from_spread else "c")
    try:  # every input read and checked before the output is written
        a = _json(args.preset_a)
        runs = gh.read_runs(args.spread_bench)
        cpu = host_speed.unstretched(a, args.preset_a)
        spread = host_speed.call_spread(cpu, runs)
        if args.speed_from_spread:
            a["host_speed_factor"] = host_speed.preset_field(host_speed.factor(cpu, runs),
                                                             ", ".join(args.spread_bench))
        first = writer_first_test_us(args.first_test_from) if args.first_test_from else None
        cold = after_sleep_factor(args.after_sleep_from) if args.after_sleep_from else None
        free = submit_gil_free(args.submit_gil_free_from) if args.submit_gil_free_from else None
        c = build(a, read_json(args.lock_bench), str(args.lock_bench), spread,
                  ", ".join(args.spread_bench), design, first, cold, free)
    except (OSError, ValueError, KvsimError) as e:
        print(f"concurrency_preset6.py: {e}", file=sys.stderr)
        return 2
    if args.no_call_costs:
        c = without_call_costs(c)
    args.out.write_text(json.dumps(c, indent=1) + "\n")
    print(json.dumps({k: c[k]["value"] for k in (*LOCK_TERMS, "after_sleep_factor",
                                               "copy_submit_gil_free") if k in c}
                     | {"spread": spread}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
