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

import argparse
import json
import sys
from collections.abc import Callable

import numpy as np

from kvsim.errors import KvsimError
from kvsim.scenario.run import ScenarioFile, execute, load_scenario_file
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


def add_parser(sub) -> None:
    p = sub.add_parser("explore", help="re-run a scenario under many seeded schedules")
    p.add_argument("scenario")
    p.add_argument("--schedules", type=int, default=200,
                   help="how many seeded schedules to run per variant (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the schedule seeds (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, e.g. --set sim.jitter=0.2")
    p.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    say = (lambda m: None) if args.quiet else (lambda m: print(f"kvsim explore: {m}", file=sys.stderr))
    try:
        if not 1 <= args.schedules <= 100_000:
            raise KvsimError(f"--schedules {args.schedules}: must be in [1, 100000]")
        if not 0 <= args.seed < 2**63:
            raise KvsimError(f"--seed {args.seed}: must be in [0, 2**63)")
        result = explore(load_scenario_file(args.scenario, args.set), args.schedules, args.seed,
                         progress=say)
    except KvsimError as e:
        print(f"kvsim explore: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for name, v in result["variants"].items():
            print(f"{name}: {v['failing']} of {v['schedules']} schedules failing")
            for f in v["failing_schedules"][:20]:
                print(f"  seed {f['schedule_seed']}: {', '.join(f['findings'])} -- reproduce: "
                      f"kvsim run {args.scenario} --set sim.schedule_seed={f['schedule_seed']}")
    return 0
