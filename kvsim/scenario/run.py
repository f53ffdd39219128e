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
"""

from __future__ import annotations

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


def run_scenario(sf: ScenarioFile, progress=None) -> dict:
    """The scenario as written, plus each variant's summary."""
    results = execute(sf.base, progress)
    if sf.variants:
        results["variants"] = {}
        # results.json sorts its keys: the run's order is kept here for the report
        results["variant_order"] = [variant.name for variant, _ in sf.variants]
        for i, (variant, scenario) in enumerate(sf.variants):
            if progress is not None:
                progress(f"variant {i + 1}/{len(sf.variants)}: {variant.name}")
            v_results = execute(scenario)
            v_results["variant"] = {"name": variant.name, "of": sf.base.name,
                                    "set": {k: v for k, v in variant.overrides}}
            summary = variant_summary(v_results, variant)
            results["variants"][variant.name] = summary
            results.setdefault("_variant_results", {})[variant.name] = v_results
    return results


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
