"""Interleaving exploration: one scenario under many seeded schedules.

Each schedule re-runs the scenario (and each of its variants) in the simulator with
``sim.schedule_seed`` set: every modelled delay is perturbed by up to ``sim.jitter`` and thread
starts and lock requests by up to a microsecond, which permutes events that would otherwise be
simultaneous. A schedule is reported when its run found a lock-discipline or invariant
violation, a deadlock or a stuck thread, or a starved writer (readers that entered after it made
it wait); the seed reproduces it with
``kvsim run SCENARIO --set sim.schedule_seed=SEED``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.load import ScenarioFile
from kvsim.scenario.run import execute
from kvsim.scenario.schema import Scenario


def _with_seed(scenario: Scenario, seed: int) -> Scenario:
    from dataclasses import replace

    return replace(scenario, sim=replace(scenario.sim, schedule_seed=seed))


def schedule_seeds(seed: int, count: int) -> list[int]:
    return [int(s) for s in np.random.default_rng(seed).integers(0, 2**31 - 1, size=count)]


def explore(sf: ScenarioFile, schedules: int, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> dict:
    runs: list[tuple[str, Scenario]] = (
        [(v.name, scenario) for v, scenario in sf.variants]
        if sf.base.variants else [("base", sf.base)])
    for name, scenario in runs:
        if scenario.executor != "sim":
            raise KvsimError(f"explore needs executor: sim (variant {name!r} uses "
                             f"{scenario.executor!r})")
    seeds = schedule_seeds(seed, schedules)
    out: dict = {"scenario": sf.base.name, "file": sf.base.source_file, "schedules": schedules,
                 "seed": seed, "variants": {}}
    for name, scenario in runs:
        failing = []
        for i, s in enumerate(seeds):
            res = execute(_with_seed(scenario, s))
            kinds = sorted({v.get("kind", "invariant") for v in res["violations"]}
                           | {d["kind"] for d in res["deadlocks"]}
                           | ({"starvation"} if (res.get("starvation") or {}).get("starved") else set()))
            if kinds:
                failing.append({"schedule_seed": s, "findings": kinds,
                                "violations": len(res["violations"]),
                                "deadlocks": len(res["deadlocks"]),
                                "first": (res["violations"] or res["deadlocks"] or [res["starvation"]])[0]})
            if progress is not None and (i + 1) % max(1, schedules // 10) == 0:
                progress(f"{name}: {i + 1}/{schedules} schedules, {len(failing)} failing")
        out["variants"][name] = {"schedules": schedules, "failing": len(failing),
                                 "clean": schedules - len(failing),
                                 "failing_schedules": failing}
    return out
