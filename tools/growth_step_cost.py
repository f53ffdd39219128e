"""The validation scenario's growth steps against the CPU cost model, on this machine, no GPU.

On the H200 the probe scenario's background resize (a 200K-token request grown in 8 steps, two
pool groups with a sliding window) spends 1.7-2.3 ms per growth step in the manager while the
calibrated CPU model predicts 0.3-0.9 ms (reports/validation-h200/README.md). This tool asks
whether that is the machine or the model: it times each growth step here, single-threaded
(``perf_counter`` around ``KvCache.resize``, median of ``--repeats`` fresh managers), calibrates
the CPU model here (``kvsim.calibration.cpu_fit``, its fit cases) and prices the same steps'
counts with it; then again with extra fit cases that vary the eviction candidates apart from the
migrated pages (resizes on GPU tiers of 4096-32768 pages; the standard cases all scan 8192).

    python3 tools/growth_step_cost.py [--repeats 3] [SCENARIO]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from kvsim.calibration import cpu_fit
from kvsim.manager import KVCacheManager
from kvsim.scenario.load import load_scenario
from kvsim.workloads import burst_resize


def growth_steps(scenario, repeats: int) -> list[tuple[float, dict]]:
    """(median seconds, counts) per growth step of the scenario's background resize."""
    bg = scenario.workload.background
    spec = burst_resize.BurstResizeWorkload(
        history_tokens=bg.history_tokens, capacity_tokens=bg.capacity_tokens,
        growth_steps=bg.growth_steps, gpu_fill_fraction=bg.gpu_fill_fraction,
        filler_requests=bg.filler_requests)
    times: list[list[float]] = []
    counts: list[dict] = []
    for _ in range(repeats):
        manager = KVCacheManager(scenario.manager)
        step = 0
        for call in burst_resize.calls(scenario.manager, spec, manager, scenario.seed):
            t0 = time.perf_counter()
            outcome = call.invoke()
            dt = time.perf_counter() - t0
            if call.phase == "growth":
                if len(times) <= step:
                    times.append([])
                    counts.append({u: getattr(outcome.plan.counts, u) for u in cpu_fit.UNITS})
                times[step].append(dt)
                step += 1
    return [(statistics.median(t), c) for t, c in zip(times, counts)]


def decorrelating_cases(repeats: int) -> list[cpu_fit.Case]:
    out = []
    for gpu_pages in (4096, 16384, 32768):
        for pages in (500, 2000):
            s, samples, counts = cpu_fit._time(cpu_fit._resize_case(pages, True, gpu_pages),
                                               repeats)
            out.append(cpu_fit.Case(f"resize evicting {pages} pages of a {gpu_pages}-page GPU",
                                    "fit", s, {u: getattr(counts, u) for u in cpu_fit.UNITS},
                                    samples, s, samples, one_shot=True))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default="scenarios/validation/h200_probe_during_resize.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    scenario = load_scenario(args.scenario, ["executor=sim"])
    steps = growth_steps(scenario, args.repeats)
    cases = cpu_fit.measure(args.repeats)
    standard = cpu_fit.fit(cases)
    extra = decorrelating_cases(args.repeats)
    widened = cpu_fit.fit(cases + extra)
    print("growth step  measured_us  predicted_us(standard cases)  predicted_us(+decorrelating)  "
          "eviction_candidates  pages_migrated")
    for i, (s, c) in enumerate(steps):
        print(f"{i:11d}  {s * 1e6:11.0f}  {cpu_fit.predict_us(standard, c):28.0f}  "
              f"{cpu_fit.predict_us(widened, c):28.0f}  {c['eviction_candidates']:19d}  "
              f"{c['pages_migrated']:14d}")
    for case in extra:
        print(f"{case.name}: {case.seconds * 1e6:.0f} us, {case.counts['eviction_candidates']} "
              f"candidates, {case.counts['pages_migrated']} migrated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
