"""Building each executor from a scenario and running it: the plan executor, the simulator, the
hardware executor. Each returns the scenario's results object (:mod:`kvsim.scenario.results`).

The workload's set-up calls run first, untimed, on the manager (:func:`run_setup`); then its
threads under the executor. Settings come from the scenario's ``sim:`` and ``hw:`` blocks.
"""

from __future__ import annotations

import time
from dataclasses import replace

from kvsim.manager import KVCacheManager
from kvsim.runtime.steps import Workload
from kvsim.runtime.untimed import error_text, plan_run, run_setup
from kvsim.scenario.results import plan_results, timed_results
from kvsim.scenario.schema import Scenario
from kvsim.workloads import build_workload


def _setup(scenario: Scenario) -> tuple[KVCacheManager, Workload]:
    manager = KVCacheManager(scenario.manager)
    return manager, build_workload(scenario.workload, scenario.manager, manager, scenario.seed)


def _summary(workload: Workload) -> dict:
    """The workload's own figures, if it keeps any (a serving engine's TTFT)."""
    return {} if workload.summary is None else {"workload_summary": workload.summary()}


def run_plan(scenario: Scenario) -> dict:
    manager, workload = _setup(scenario)
    run = plan_run(manager, workload)
    return plan_results(scenario, manager, run.records, run.violations) | _summary(workload)


def run_sim(scenario: Scenario, progress=None) -> dict:
    from kvsim.sim.collector import no_collections

    # The whole run, setup and results included: a full collection that lands in the setup of
    # a burst (thousands of radix nodes) costs as much as the run itself.
    with no_collections():
        return _run_sim(scenario, progress)


def _run_sim(scenario: Scenario, progress) -> dict:
    from kvsim.hardware import load_hardware
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.sim.executor import SimExecutor, SimOptions

    hardware = load_hardware(scenario.hardware)
    cpu = load_cpu_model(scenario.cpu_model)
    manager, workload = _setup(scenario)
    setup_failed = run_setup(workload.setup)
    s = scenario.sim
    options = SimOptions(lock_policy=s.lock_policy, copy_path=s.copy_path,
                         kernel_ctas=s.kernel_ctas, kernel_inflight_bytes=s.kernel_inflight_bytes,
                         aligned=s.aligned, wait_for_copies=s.wait_for_copies,
                         gil_release=dict(s.gil_release), check_invariants=s.check_invariants,
                         check_lock_discipline=s.check_lock_discipline,
                         schedule_seed=s.schedule_seed, jitter=s.jitter,
                         gil_seed=scenario.seed if s.gil_seed is None else s.gil_seed)
    disk = None
    if s.disk is not None:
        from kvsim.hardware.disk import load_disk

        disk = load_disk(s.disk, s.disk_drives)
    executor = SimExecutor(manager, hardware, cpu, options, disk)
    executor.progress = progress
    wall0 = time.perf_counter()
    run = executor.run(workload.make_threads())
    wall = time.perf_counter() - wall0
    results = timed_results(scenario, manager, run, hardware.name)
    return results | _summary(workload) | {
        "cpu_model": cpu.name,
        "sim": {"end_time_s": run.end_time, "events": run.events_processed,
                "options": {k: (dict(v) if k == "gil_release" else v)
                            for k, v in vars(options).items()}},
        "setup_failures": setup_failed,
        **({"disk": vars(disk)} if disk is not None else {}),
        "_wall_s": wall,  # not written to results.json (varies run to run)
    }


def run_hw(scenario: Scenario) -> dict:
    """Real threads, the real lock and (copier ``cuda``) real copies on a GPU.

    With ``hw.warmup_runs`` the whole scenario first runs that many times in this process (fresh
    manager and pools each time, no trace, no verification) and those runs are discarded."""
    quiet = replace(scenario, hw=replace(scenario.hw, record_trace=None, verify=False,
                                         warmup_runs=0))
    for _ in range(scenario.hw.warmup_runs):
        _run_hw_once(quiet)
    return _run_hw_once(scenario)


def _torch_forward(scenario: Scenario):
    """Real prefills for a serving workload (hw.forward: torch), warmed up."""
    from hw.serving_forward import TorchForward
    from kvsim.errors import ConfigError
    from kvsim.llm.engine_time import load_engine_times
    from kvsim.serving.engine import load_requests, serving_architecture

    w = scenario.workload
    if w.kind != "serving":
        raise ConfigError(f"hw.forward torch runs a serving workload's passes; this workload is "
                          f"{w.kind}")
    arch = serving_architecture(w)
    longest = max(r.input_length for r in load_requests(w))
    forward = TorchForward(arch, load_engine_times(w.engine_times, arch),
                           f"cuda:{scenario.hw.device}", longest, scenario.hw.decode_wait)
    forward.warm_up()
    return forward


def _run_hw_once(scenario: Scenario) -> dict:
    from hw.executor import HwExecutor, HwOptions, NullCopier
    from kvsim.hardware import load_hardware

    hardware = load_hardware(scenario.hardware)
    manager, workload = _setup(scenario)
    s, h = scenario.sim, scenario.hw
    recorder = None
    unrecorded_setup = [0]
    on_call = None
    if h.record_trace:
        from kvsim.runtime.recording import to_trace_op
        from kvsim.traces.op_trace import OpTraceWriter

        recorder = OpTraceWriter(h.record_trace)

        def on_call(call, outcome) -> None:  # setup at t = 0 on its own thread; the threads
            op = to_trace_op(call, "setup", 0.0, outcome.ok, outcome.value,  # start 1 s later
                             error_text(outcome), None)
            if op is None:
                unrecorded_setup[0] += 1
            else:
                recorder.write(op)
    setup_failed = run_setup(workload.setup, on_call)
    pools = None
    if h.copier == "cuda":
        from hw.copier import PoolCopier
        from hw.pools import HostDevicePools

        pools = HostDevicePools(manager.layout, [lv.quota_bytes for lv in scenario.manager.levels],
                                device=h.device, hardware=hardware)
        copier = PoolCopier(pools, hardware, s.copy_path, verify=h.verify, ctas=s.kernel_ctas,
                            inflight_bytes=s.kernel_inflight_bytes)
    else:
        copier = NullCopier()
    # Per-call checks cost real time inside the measured calls: only in --verify runs.
    options = HwOptions(lock_policy=s.lock_policy, wait_for_copies=s.wait_for_copies,
                        check_invariants_per_call=h.verify and s.check_invariants,
                        check_lock_discipline=h.verify and s.check_lock_discipline)
    forward = _torch_forward(scenario) if h.forward == "torch" else None
    executor = HwExecutor(manager, copier, options, recorder=recorder, record_offset_s=1.0,
                          forward=forward)
    try:
        run = executor.run(workload.make_threads(), warm_gpu_ms=h.warm_gpu_ms)
        if recorder is not None:
            recorder.close()
    finally:
        if pools is not None:
            pools.close()
    unrecorded = executor.unrecorded + unrecorded_setup[0] if recorder else None
    return timed_results(scenario, manager, run, hardware.name) | _summary(workload) | {
        "hw": {"copier": copier.name, "verify": h.verify, "thread_errors": run.errors,
               "pages_verified": getattr(copier, "pages_verified", 0),
               "pages_signed": getattr(copier, "pages_signed", 0),
               "end_time_s": run.end_time,
               "recorded_trace": h.record_trace,
               "warmup_runs": h.warmup_runs, "warm_gpu_ms": h.warm_gpu_ms,
               "sm_clock_mhz_at_start": getattr(copier, "sm_clock_mhz_at_start", None),
               "unrecorded_calls": unrecorded,
               **({"forward": forward.summary()} if forward is not None else {})},
        "setup_failures": setup_failed,
    }
