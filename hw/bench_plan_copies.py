"""Plan-shaped copy batches through the hardware executor's copier: what a manager plan costs.

``python3 -m hw.bench_plan_copies --out DIR`` (GPU machine) writes ``DIR/<date>-plan-copies.json``.

What it moves: :class:`~kvsim.manager.plan.CopyBatch` batches laid out as the manager lays pages
out (one slot per pool of a pool group, scattered slots: random distinct slots on both sides),
offload (device -> pinned mapped host) and onboard, through :class:`hw.executor_copies.PlanCopier`
and :class:`hw.pools.HostDevicePools` -- the code path of ``kvsim run`` with ``executor: hw``.
Grid: pool slot sizes ``4 KiB x1, 16 KiB x1, 4 KiB x2, 16 KiB x2`` (one kernel launch per pool),
1024 / 4096 / 16384 pages, the kernel forced to 2 / 4 / 8 / 32 CTAs at the selector's bytes in
flight. 8 KiB slots and 6380-page batches are left out on purpose: they are the validation
scenario's, judged, not fitted.

How it is timed, per point (median of ``--repeats``, after one untimed run of the point):
* ``device_s``: CUDA events recorded on the copier's stream before and after the batch (index
  upload and every launch of the batch included);
* ``submit_s``: ``time.perf_counter`` around ``PlanCopier.submit`` (what the executor's call pays);
* ``select_submit_s``: the same with the path selector (``CopySelector``) choosing, as ``kvsim run``
  does with ``copy_path: select`` -- the selector's pricing included.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

POOL_SHAPES = ((4096,), (16384,), (4096, 4096), (16384, 16384))
PAGES = (1024, 4096, 16384)
CTAS = (2, 4, 8, 32)
SLOTS = 16384 + 1024


def shape_pools(shape: tuple[int, ...], hardware):
    """Device and pinned host pools of ``SLOTS`` slots each for one pool group of ``shape``
    (one pool per slot size), laid out as the manager lays them out."""
    from hw.pools import HostDevicePools
    from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig

    level_bytes = SLOTS * sum(shape)
    config = ManagerConfig(layers=(LayerConfig(slot_bytes=shape),),
                           levels=(LevelConfig("gpu", level_bytes), LevelConfig("host", level_bytes)),
                           tokens_per_block=32)
    return HostDevicePools(KVCacheManager(config).layout, [level_bytes] * 2, hardware=hardware)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hw.bench_plan_copies", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hardware", default="h200-sxm", help="preset the selector prices with")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import cupy
    import numpy as np

    from hw.executor_copies import PlanCopier
    from hw.gpu_clocks import gpu_identity
    from kvsim.hardware import load_hardware
    from kvsim.manager.plan import CopyBatch
    from kvsim.model.copy_select import CopySelector

    hardware = load_hardware(args.hardware)
    rng = np.random.default_rng(args.seed)
    records = []
    t_start = time.perf_counter()
    for shape in POOL_SHAPES:
        pools = shape_pools(shape, hardware)
        try:
            stream = cupy.cuda.Stream(non_blocking=True)
            selector = CopySelector(hardware)
            for direction, (src_level, dst_level) in (("offload", (0, 1)), ("onboard", (1, 0))):
                inflight = int(hardware.kernel.default_inflight_bytes[direction])
                for pages in PAGES:
                    src = rng.choice(SLOTS, pages, replace=False).astype(np.int32)
                    dst = rng.choice(SLOTS, pages, replace=False).astype(np.int32)
                    batch = CopyBatch(src_level, dst_level, 0, src, dst, shape)
                    for ctas in CTAS:
                        copier = PlanCopier(pools, path="kernel", stream=stream, ctas=ctas,
                                            inflight_bytes=inflight)
                        copier.run([batch])  # untimed
                        dev, sub = [], []
                        for _ in range(args.repeats):
                            t0 = time.perf_counter()
                            (rec,) = copier.submit([batch])
                            sub.append(time.perf_counter() - t0)
                            copier.wait()
                            dev.append(rec.device_s)
                        records.append({
                            "direction": direction, "pool_slot_bytes": list(shape),
                            "pages": pages, "bytes": batch.num_bytes, "ctas": ctas,
                            "inflight_bytes": inflight, "launches": len(shape),
                            "device_s": statistics.median(dev), "device_samples_s": dev,
                            "submit_s": statistics.median(sub), "submit_samples_s": sub})
                        print(json.dumps({k: records[-1][k] for k in
                                          ("direction", "pool_slot_bytes", "pages", "ctas",
                                           "device_s", "submit_s")}), flush=True)
                    sel = PlanCopier(pools, selector=selector, stream=stream)
                    sel.run([batch])
                    subs = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        sel.submit([batch])
                        subs.append(time.perf_counter() - t0)
                        sel.wait()
                    records.append({"direction": direction, "pool_slot_bytes": list(shape),
                                    "pages": pages, "bytes": batch.num_bytes, "ctas": None,
                                    "launches": len(shape), "select_submit_s": statistics.median(subs),
                                    "select_submit_samples_s": subs})
        finally:
            pools.close()
    out = {
        "what": "plan-shaped copy batches through hw.executor_copies.PlanCopier (kernel path)",
        "command": "python3 -m hw.bench_plan_copies " + " ".join(argv or []),
        "timing": __doc__.split("How it is timed")[1].strip(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "provenance": {**gpu_identity(0), "cupy": cupy.__version__,
                       "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                       "python": platform.python_version(), "host": platform.node()},
        "hardware_preset": args.hardware, "slots_per_level": SLOTS,
        "elapsed_s": time.perf_counter() - t_start, "records": records}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"{out['date_utc'][:10]}-plan-copies.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
