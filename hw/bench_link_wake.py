"""The first copy after the link has been idle: how much slower, after how long an idle spell.

``python3 -m hw.bench_link_wake --out DIR`` (GPU machine) writes ``DIR/<date>-link-wake.json``.

What it moves: plan-shaped kernel batches (scattered slots, one launch per pool) through
:class:`hw.executor_copies.PlanCopier`, offload and onboard, pools of 4 KiB x1, 16 KiB x1, 4 KiB x2
and 16 KiB x2 slots, 1024 / 4096 / 16384 pages, 8 CTAs at the selector's bytes in flight (the
validation scenario's 8 KiB x2, 6380-page shape is left out: it judges).
How it is timed: CUDA events around the batch (index upload included). ``warm_s``: median of 5
back-to-back runs after one untimed run. ``after_idle_s``: median of 3 runs, each after the GPU
and the link have been left idle (``time.sleep``) for ``--idle-s``. ``idle_sweep``: one shape
(16 KiB x2, 4096 pages, offload) after idle spells of 1 ms to 3 s, 3 runs each. The PCIe link
generation NVML reports is read just before each idle-run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from hw.bench_plan_copies import PAGES, POOL_SHAPES, SLOTS, shape_pools

IDLE_SWEEP_S = (0.001, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hw.bench_link_wake", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--idle-s", type=float, default=1.0)
    p.add_argument("--hardware", default="h200-sxm")
    args = p.parse_args(argv)

    import numpy as np

    from hw.executor_copies import PlanCopier
    from hw.gpu_clocks import gpu_identity, pcie_link_gen
    from kvsim.hardware import load_hardware
    from kvsim.manager.plan import CopyBatch

    hardware = load_hardware(args.hardware)
    rng = np.random.default_rng(0)
    records, sweep = [], []
    for shape in POOL_SHAPES:
        pools = shape_pools(shape, hardware)
        try:
            for direction, (src, dst) in (("offload", (0, 1)), ("onboard", (1, 0))):
                inflight = int(hardware.kernel.default_inflight_bytes[direction])
                copier = PlanCopier(pools, path="kernel", ctas=8, inflight_bytes=inflight)
                for pages in PAGES:
                    batch = CopyBatch(src, dst, 0, rng.choice(SLOTS, pages, replace=False).astype(np.int32),
                                      rng.choice(SLOTS, pages, replace=False).astype(np.int32), shape)
                    copier.run([batch])
                    warm = [copier.run([batch])[0].device_s for _ in range(5)]
                    idle, gens = [], []
                    for _ in range(3):
                        time.sleep(args.idle_s)
                        gens.append(pcie_link_gen(0))
                        idle.append(copier.run([batch])[0].device_s)
                    records.append({"direction": direction, "pool_slot_bytes": list(shape),
                                    "pages": pages, "bytes": batch.num_bytes, "ctas": 8,
                                    "warm_s": statistics.median(warm), "warm_samples_s": warm,
                                    "after_idle_s": statistics.median(idle), "after_idle_samples_s": idle,
                                    "link_gen_before_idle_runs": gens})
                    print(json.dumps({k: records[-1][k] for k in ("direction", "pool_slot_bytes", "pages",
                                                                  "warm_s", "after_idle_s")}), flush=True)
                    if shape == (16384, 16384) and pages == 4096 and direction == "offload":
                        for idle_s in IDLE_SWEEP_S:
                            runs = []
                            for _ in range(3):
                                copier.run([batch])
                                time.sleep(idle_s)
                                runs.append(copier.run([batch])[0].device_s)
                            sweep.append({"idle_s": idle_s, "device_s": statistics.median(runs),
                                          "samples_s": runs})
                            print(json.dumps(sweep[-1]), flush=True)
        finally:
            pools.close()
    out = {"what": "kernel batches through PlanCopier: warm vs after an idle spell",
           "provenance": gpu_identity(0),
           "timing": __doc__.split("How it is timed: ")[1].split("\n\"\"\"")[0].strip(),
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "idle_s": args.idle_s,
           "records": records, "idle_sweep": sweep}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"{out['date_utc'][:10]}-link-wake.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
