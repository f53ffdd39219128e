"""Where the time of the H200 burst resize goes: process warmth, GPU clocks, submission, CTAs.

Runs on the GPU machine (``python tools/burst_breakdown.py --out DIR``) and writes
``DIR/burst-breakdown.json``. Every figure names what it times:

* ``runs``: the hardware scenario ``scenarios/hw/h200_burst_resize.yaml`` executed in this one
  process, in order: the first run (a cold process), then runs in the warm process after 2 s of
  GPU idleness, then runs with ``warm_gpu_ms`` of SM spinning right before the threads start.
  Per run: ``resize()`` manager time (``perf_counter`` around the manager call), copy submission
  time (``perf_counter`` around the copier), device time of the copy (CUDA events), GB/s, CTAs,
  the SM clock (NVML) when the threads started.
* ``kernel_ctas``: the run's own copy batch (captured from the copier: 6380 pages, its real
  slots) replayed on fresh pools with the kernel forced to N CTAs, after 1.5 s idle ("idle") and
  right after a 200 ms spin ("busy"); device time by CUDA events around the batch, median of 3.
* ``submission``: the pieces of one submission, host ``perf_counter`` medians of 20 on a warm GPU:
  the path selector's pricing, the slot-index uploads, the kernel launches (with the default and
  with the selector's bytes in flight, whose kernel variants differ).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SCENARIO = "scenarios/hw/h200_burst_resize.yaml"


def _run_figures(results: dict) -> dict:
    call = next(c for c in results["calls"] if c["api"] == "KvCache.resize" and c["phase"] == "growth")
    copy = results["copies"][0] if results["copies"] else {}
    return {"cpu_ms": call["cpu_ms"], "submit_ms": call["submit_ms"],
            "host_ms": call["latency_ms"], "copies_done_ms": call["copies_done_ms"] - call["start_ms"],
            "copy_ms": copy.get("seconds", 0) * 1e3, "copy_gbps": copy.get("gbps"),
            "path": copy.get("path"), "ctas": copy.get("ctas"),
            "sm_clock_mhz_at_start": results["hw"]["sm_clock_mhz_at_start"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--warm-runs", type=int, default=3)
    args = p.parse_args()

    import cupy
    import numpy as np

    import hw.copier
    from hw.copy_kernels import copy_pages
    from hw.executor_copies import PlanCopier
    from hw.gpu_clocks import gpu_identity, keep_busy, sm_clock_mhz
    from hw.pools import HostDevicePools
    from kvsim.hardware import load_hardware
    from kvsim.manager import KVCacheManager
    from kvsim.model.copy_select import CopySelector
    from kvsim.scenario.load import load_scenario
    from kvsim.scenario.run import execute

    captured = []
    original_submit = hw.copier.PoolCopier.submit

    def capturing_submit(self, batch, thread, api, now):
        captured.append(batch)
        return original_submit(self, batch, thread, api, now)

    hw.copier.PoolCopier.submit = capturing_submit
    out: dict = {"what": __doc__.split("\n")[0], "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "scenario": SCENARIO, "runs": []}
    base = load_scenario(SCENARIO)

    def one(label: str, overrides: list[str]) -> None:
        results = execute(load_scenario(SCENARIO, overrides))
        fig = _run_figures(results) | {"label": label, "overrides": overrides}
        out["runs"].append(fig)
        print(label, json.dumps(fig), flush=True)

    one("cold process, idle GPU", [])
    for i in range(args.warm_runs):
        time.sleep(2.0)
        one(f"warm process, idle GPU #{i + 1}", [])
    for i in range(args.warm_runs):
        one(f"warm process, GPU spun 300 ms #{i + 1}", ["hw.warm_gpu_ms=300"])
    hw.copier.PoolCopier.submit = original_submit

    batch = captured[0]
    hardware = load_hardware(base.hardware)
    manager = KVCacheManager(base.manager)
    pools = HostDevicePools(manager.layout, [lv.quota_bytes for lv in base.manager.levels],
                            hardware=hardware)
    try:
        stream = cupy.cuda.Stream(non_blocking=True)
        out["batch"] = {"kind": batch.kind, "pages": batch.num_pages,
                        "pool_slot_bytes": list(batch.pool_slot_bytes), "bytes": batch.num_bytes}
        rows = []
        for state in ("idle", "busy"):
            for ctas in (2, 4, 8, 16, 32, 64, 132):
                samples, clocks = [], []
                for _ in range(3):
                    if state == "idle":
                        time.sleep(1.5)
                    else:
                        keep_busy(200, stream)
                    clocks.append(sm_clock_mhz(0))
                    copier = PlanCopier(pools, path="kernel", stream=stream, ctas=ctas)
                    (rec,) = copier.run([batch])
                    samples.append(rec.device_s)
                med = statistics.median(samples)
                rows.append({"state": state, "ctas": ctas, "device_ms": med * 1e3,
                             "gbps": batch.num_bytes / med / 1e9, "samples_ms": [s * 1e3 for s in samples],
                             "sm_clock_mhz_before": clocks})
                print("kernel", json.dumps(rows[-1]), flush=True)
        out["kernel_ctas"] = rows

        selector = CopySelector(hardware)
        src, dst = batch.src_slots, batch.dst_slots
        keep_busy(100, stream)
        t = {"selector_choose_ms": [], "index_upload_ms": [], "launch_default_inflight_ms": [],
             "launch_selector_inflight_ms": []}
        inflight_sel = int(hardware.kernel.default_inflight_bytes[batch.kind])
        sb, db = pools.base(0, batch.pool_group, 0), pools.base(1, batch.pool_group, 0)
        nbytes = batch.pool_slot_bytes[0]
        for _ in range(20):
            t0 = time.perf_counter()
            selector.choose_for_batch(batch)
            t1 = time.perf_counter()
            with stream:
                d_src, d_dst = cupy.asarray(src), cupy.asarray(dst)
            t2 = time.perf_counter()
            copy_pages(sb, db, nbytes, d_src, d_dst, 4, pools.default_inflight("offload"), stream)
            t3 = time.perf_counter()
            copy_pages(sb, db, nbytes, d_src, d_dst, 4, inflight_sel, stream)
            t4 = time.perf_counter()
            stream.synchronize()
            for key, a, b in (("selector_choose_ms", t0, t1), ("index_upload_ms", t1, t2),
                              ("launch_default_inflight_ms", t2, t3),
                              ("launch_selector_inflight_ms", t3, t4)):
                t[key].append((b - a) * 1e3)
        out["submission"] = {k: {"median": statistics.median(v), "first": v[0], "samples": v}
                             for k, v in t.items()}
        out["submission"]["inflight_bytes"] = {"pool_default": pools.default_inflight("offload"),
                                               "selector": inflight_sel}
        print("submission", json.dumps({k: v["median"] if isinstance(v, dict) and "median" in v
                                        else v for k, v in out["submission"].items()}), flush=True)
    finally:
        pools.close()
    out.update(gpu_identity(0))
    out["cupy"] = cupy.__version__
    out["numpy"] = np.__version__
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "burst-breakdown.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
