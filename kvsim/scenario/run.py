"""Running a scenario: dispatch to its executor, then each variant.

Executors (:mod:`kvsim.scenario.executors`):

* ``plan`` runs every call through the manager in order and records, per call, the plan it
  produced and the tier occupancy after it. It attaches no time.
* ``sim`` runs the setup calls untimed, then the workload's threads in the SimPy model
  (:mod:`kvsim.sim.executor`) on the scenario's hardware and CPU cost presets.
* ``hw`` runs the same threads on real threads, the real lock and (with CuPy) real copies.

All check the manager's invariants; what they find goes to ``violations``. A scenario with
``variants`` runs once as written and once per variant (its ``set`` overrides applied); each
variant's summary, with its error against any ``reference`` figures, goes under ``variants``.
A variant that resolves to a scenario already run (an empty ``set``, or overrides that restate
what is there) is not run again on a deterministic executor (``plan``, ``sim``: the same scenario
gives byte-identical results): it gets a copy of that run's results. On ``hw`` it is measured
again.
"""

from __future__ import annotations

import copy
import dataclasses

from kvsim.scenario.executors import run_hw, run_plan, run_sim
from kvsim.scenario.load import ScenarioFile
from kvsim.scenario.results import variant_summary
from kvsim.scenario.schema import Scenario


def execute(scenario: Scenario, progress=None) -> dict:
    """Run one scenario (no variants); returns its results object."""
    if scenario.executor == "sim":
        return run_sim(scenario, progress)
    if scenario.executor == "hw":
        return run_hw(scenario)
    return run_plan(scenario)


DETERMINISTIC = ("plan", "sim")  # executors whose results depend on the scenario alone


def run_scenario(sf: ScenarioFile, progress=None) -> dict:
    """The scenario as written, plus each variant's summary."""
    results = execute(sf.base, progress)
    if sf.variants:
        # (what ran, its name, its results before this function added to them)
        ran = [(_run_of(sf.base), "the run as written", dict(results))]
        results["variants"] = {}
        # results.json sorts its keys: the run's order is kept here for the report
        results["variant_order"] = [variant.name for variant, _ in sf.variants]
        for i, (variant, scenario) in enumerate(sf.variants):
            this = _run_of(scenario)
            twin = next(((name, r) for run, name, r in ran if run == this), None) \
                if scenario.executor in DETERMINISTIC else None
            if progress is not None:
                progress(f"variant {i + 1}/{len(sf.variants)}: {variant.name}"
                         + (f" (the same run as {twin[0]}: its results reused)" if twin else ""))
            if twin is None:
                v_results = execute(scenario)
                ran.append((this, f"variant {variant.name}", dict(v_results)))
            else:
                v_results = copy.deepcopy(twin[1]) | {"_reused_from": twin[0]}
            v_results["variant"] = {"name": variant.name, "of": sf.base.name,
                                    "set": {k: v for k, v in variant.overrides}}
            summary = variant_summary(v_results, variant)
            results["variants"][variant.name] = summary
            results.setdefault("_variant_results", {})[variant.name] = v_results
    return results


def _run_of(scenario: Scenario) -> Scenario:
    """What a run of ``scenario`` depends on: all of it but its list of variants."""
    return dataclasses.replace(scenario, variants=())


def missing_requirement(scenario: Scenario) -> str | None:
    """What this machine lacks to run ``scenario`` (one line saying how to get it), or None."""
    import importlib.util

    if scenario.executor == "hw" and scenario.hw.copier == "cuda":
        for module, what in (("cupy", "CuPy"), ("pynvml", "NVML's Python bindings")):
            if importlib.util.find_spec(module) is None:
                return (f"executor hw with hw.copier cuda needs {what} and an NVIDIA GPU; "
                        f"{module} is not installed: pip install -e '.[hw]' on a GPU machine "
                        "(or --set hw.copier=none: real threads and lock, no copies)")
    return None
