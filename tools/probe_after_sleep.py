"""What a probe costs right after its thread slept, against back to back (a diagnostic).

Behind the first miss of ``reports/validation-h200/concurrency/README.md``: with think time
between probes the measured probe p50 is ~0.1 ms above the closed-loop cost the CPU preset
prices. This times it directly, on one Python thread with nothing else running: the
probe_during_resize scenario's manager after its setup (the GPU tier full of committed requests),
``KVCacheManager.probe_reuse`` of a filler request's first 4096 tokens (the scenario's probe),
timed with ``time.perf_counter`` around the call. Rounds, each in a seeded random order of the
conditions: ``n`` probes back to back, and ``n`` probes each after ``time.sleep(S)`` for every S.
Per condition: median and p90 of the probe time, and the median's excess over back to back.

    python3 tools/probe_after_sleep.py OUT.json [--rounds 10] [--n 200] [--sleeps-us 500,2000]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvsim.manager import KVCacheManager  # noqa: E402
from kvsim.scenario.load import load_scenario  # noqa: E402
from kvsim.workloads import build_workload  # noqa: E402

SCENARIO = "scenarios/concurrency/probe_during_resize.yaml"


def probe_call(scenario_path: str = SCENARIO):
    """The scenario's first probe as a zero-argument callable, after the workload's setup."""
    sc = load_scenario(ROOT / scenario_path)
    manager = KVCacheManager(sc.manager)
    workload = build_workload(sc.workload, sc.manager, manager, sc.seed)
    for call in workload.setup:
        call.invoke()
    first = next(workload.make_threads()["probe0"])
    keep = workload  # the workload's holds keep its caches open while we probe
    return (lambda: first.invoke()), keep


def measure(rounds: int, n: int, sleeps_s: list[float], seed: int = 0) -> dict:
    probe, _keep = probe_call()
    for _ in range(200):  # warm up: caches, allocator, branch predictors
        probe()
    conditions = [0.0, *sleeps_s]
    times: dict[float, list[float]] = {s: [] for s in conditions}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = conditions[:]
        rng.shuffle(order)
        for s in order:
            for _ in range(n):
                if s:
                    time.sleep(s)
                t0 = time.perf_counter()
                probe()
                times[s].append(time.perf_counter() - t0)
    base = float(np.median(times[0.0]))
    out = []
    for s in conditions:
        a = np.asarray(times[s]) * 1e3
        out.append({"sleep_us": s * 1e6, "probes": int(a.size), "median_ms": float(np.median(a)),
                    "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)),
                    "excess_over_back_to_back_us": (float(np.median(a)) - base * 1e3) * 1e3})
    return {"conditions": out, "samples_ms": {str(s * 1e6): [round(t * 1e3, 5) for t in times[s]]
                                              for s in conditions}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--sleeps-us", default="500,2000")
    args = ap.parse_args(argv)
    sleeps = [float(x) * 1e-6 for x in args.sleeps_us.split(",") if x]
    t0 = time.perf_counter()
    result = measure(args.rounds, args.n, sleeps)
    doc = {"what": __doc__.split("\n\n")[0], "command": " ".join(["python3", *sys.argv]),
           "scenario": SCENARIO, "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "host": {"node": platform.node(), "python": platform.python_version(),
                    "processor": platform.processor()},
           "timing": "time.perf_counter around KVCacheManager.probe_reuse, one thread",
           "elapsed_s": round(time.perf_counter() - t0, 1), **result}
    args.out.write_text(json.dumps(doc) + "\n")
    for c in result["conditions"]:
        print(f"sleep {c['sleep_us']:7.0f} us: {c['probes']} probes, median {c['median_ms']:.4f} ms, "
              f"p90 {c['p90_ms']:.4f}, excess {c['excess_over_back_to_back_us']:+.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
