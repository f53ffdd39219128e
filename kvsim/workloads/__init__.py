"""Workload generators: sequences of manager API calls, one generator per kind.

:data:`BUILDERS` is the one registry of workload kinds: a new workload adds its module here
(its spec dataclass carries ``kind`` and its defaults; the scenario schema reads them).
"""

from __future__ import annotations

from kvsim.manager import KVCacheManager, ManagerConfig
from kvsim.runtime.steps import Workload
from kvsim.serving import engine as serving
from kvsim.workloads import (
    burst_resize,
    concurrent_probe,
    gil_antagonist,
    mooncake,
    op_trace,
    seed_concurrency,
)

BUILDERS = {
    "burst_resize": burst_resize.workload,
    "concurrent_probe": concurrent_probe.workload,
    "gil_antagonist": gil_antagonist.workload,
    "seed_concurrency": seed_concurrency.workload,
    "mooncake": mooncake.workload,
    "op_trace": op_trace.workload,
    "serving": serving.workload,
}


def build_workload(spec, config: ManagerConfig, manager: KVCacheManager, seed: int) -> Workload:
    """The workload ``spec`` describes, on ``manager``."""
    return BUILDERS[spec.kind](config, spec, manager, seed)
