"""Is the burst resize's offload batch slow because of its slots? (GPU machine.)

``python3 tools/burst_batch_layouts.py`` runs ``scenarios/hw/h200_burst_resize.yaml`` once to
capture its offload batch (6380 pages, 2 pools of 8 KiB), then replays batches of the same size
on fresh pools of the scenario's layout with the kernel forced to 8 and 132 CTAs: the captured
slots, both sides sorted, both sides random, and the captured slots on a layout whose host tier
is 128 MiB instead of 1 GiB. Device time: CUDA events around the batch (index upload included),
median of 5 after one untimed run. Prints one JSON line per case.
"""

import json
import statistics
from dataclasses import replace

import numpy as np

import hw.copier
from hw.executor_copies import PlanCopier
from hw.pools import HostDevicePools
from kvsim.hardware import load_hardware
from kvsim.manager import KVCacheManager
from kvsim.scenario.load import load_scenario
from kvsim.scenario.run import execute

SCENARIO = "scenarios/hw/h200_burst_resize.yaml"
captured = []
real_submit = hw.copier.PoolCopier.submit
hw.copier.PoolCopier.submit = lambda self, b, *a: captured.append(b) or real_submit(self, b, *a)
execute(load_scenario(SCENARIO, ["hw.warmup_runs=0"]))
hw.copier.PoolCopier.submit = real_submit
batch = captured[0]
base = load_scenario(SCENARIO)
hardware = load_hardware(base.hardware)
rng = np.random.default_rng(0)
print(json.dumps({"src_first": batch.src_slots[:8].tolist(), "dst_first": batch.dst_slots[:8].tolist(),
                  "src_sorted": bool((np.diff(batch.src_slots) > 0).all()),
                  "dst_sorted": bool((np.diff(batch.dst_slots) > 0).all())}))


def timed(pools, b, ctas):
    copier = PlanCopier(pools, path="kernel", ctas=ctas, inflight_bytes=32768)
    copier.run([b])
    return statistics.median(copier.run([b])[0].device_s for _ in range(5)) * 1e3


def pick(n):
    return rng.choice(n, batch.num_pages, replace=False).astype(np.int32)


def cases(manager_cfg, quotas, label):
    layout = KVCacheManager(manager_cfg).layout
    pools = HostDevicePools(layout, quotas, hardware=hardware)
    try:
        n_src = pools.spec(0, batch.pool_group, 0).num_slots
        n_dst = pools.spec(1, batch.pool_group, 0).num_slots
        variants = {"captured": batch,
                    "sorted": replace(batch, src_slots=np.sort(batch.src_slots),
                                      dst_slots=np.sort(batch.dst_slots)),
                    "random": replace(batch, src_slots=pick(n_src), dst_slots=pick(n_dst))}
        for name, b in variants.items():
            for ctas in (8, 132):
                ms = timed(pools, b, ctas)
                print(json.dumps({"layout": label, "slots": name, "ctas": ctas, "device_ms": ms,
                                  "gbps": b.num_bytes / ms / 1e6}), flush=True)
    finally:
        pools.close()


cfg = base.manager
cases(cfg, [lv.quota_bytes for lv in cfg.levels], "scenario (host 1 GiB)")
small = replace(cfg, levels=(cfg.levels[0], replace(cfg.levels[1], quota_bytes=128 << 20)))
cases(small, [lv.quota_bytes for lv in small.levels], "host 128 MiB")
