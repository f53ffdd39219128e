"""Shared test helpers: small manager configurations; loading a script of tools/."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig, eviction_index
from kvsim.manager.storage import Storage

REPO = Path(__file__).resolve().parents[1]
PAGE = 4096  # bytes per page in the small configurations: two 2 KiB slots


def small_config(gpu_pages: int = 16, host_pages: int = 32, window: int | None = None,
                 tokens_per_block: int = 4, disk_pages: int | None = None, **kw) -> ManagerConfig:
    layers = [LayerConfig(slot_bytes=(2048, 2048))]
    if window is not None:
        layers.append(LayerConfig(slot_bytes=(2048, 2048), window_tokens=window))
    levels = [LevelConfig("gpu", gpu_pages * PAGE * len(layers)),
              LevelConfig("host", host_pages * PAGE * len(layers))]
    if disk_pages is not None:
        levels.append(LevelConfig("disk", disk_pages * PAGE * len(layers)))
    return ManagerConfig(layers=tuple(layers), levels=tuple(levels),
                         tokens_per_block=tokens_per_block, **kw)


def tree_snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every path under ``root`` (but ``skip`` and what is below it) with a digest of its
    content: equal snapshots mean nothing was created, deleted or changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else \
            hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def tokens(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.uint32)


@pytest.fixture
def mgr() -> KVCacheManager:
    return KVCacheManager(small_config())


# Every victim selection in the tests is checked against a full scan of the level, and the
# index's reservoirs are kept tiny so that the small test configurations exercise their bound and
# rebuilds (with the production sizes a reservoir would hold every page of a test level).
PRODUCTION_RESERVOIRS = (eviction_index.RESERVOIR_PAGES, eviction_index.MAX_PENDING_PAGES)
Storage.check_eviction_index = True
eviction_index.RESERVOIR_PAGES = 3
eviction_index.MAX_PENDING_PAGES = 40


@contextlib.contextmanager
def production_eviction_index(check: bool = False):
    """The eviction index as ``kvsim run`` has it (production reservoir sizes), its check against
    a full scan on only with ``check``: for tests that run whole shipped scenarios to use what
    they produce (a full scan per selection of a 100K-page level costs more than the run)."""
    saved = (Storage.check_eviction_index, eviction_index.RESERVOIR_PAGES,
             eviction_index.MAX_PENDING_PAGES)
    eviction_index.RESERVOIR_PAGES, eviction_index.MAX_PENDING_PAGES = PRODUCTION_RESERVOIRS
    Storage.check_eviction_index = check
    try:
        yield
    finally:
        (Storage.check_eviction_index, eviction_index.RESERVOIR_PAGES,
         eviction_index.MAX_PENDING_PAGES) = saved


# The longest files first (seconds on the 2-core machine, one process, 2026-12-06): the test
# command runs one file per worker at a time (--dist loadfile), so a long file that starts late
# sets the wall time; started first, the other worker takes the short files meanwhile.
LONGEST_FIRST = ("test_plan_batches.py",       # 26 s: runs every shipped scenario once
                 "test_manager_stateful.py",   # 26 s
                 "test_concurrency_judge.py",  # 16 s
                 "test_gil_handover.py",       # 11 s
                 "test_cli_usability.py",      # 11 s
                 "test_validate.py")           # 9 s


# A worker makes and drops managers of 10^4-10^5 objects test after test, and with the default
# thresholds it ran ~160 full collections, ~30 s of the test command's ~210 s of CPU (measured
# with gc.callbacks, 2026-12-06): a young collection every 50,000 net allocations of containers
# instead of 700, a middle one every 20 of them, a full one every 100 middle ones. What exists
# once the tests are collected (modules, test items) lives to the end: frozen, no collection
# walks it again. (Simulated runs turn the collector off meanwhile: kvsim.sim.collector.)
TEST_THRESHOLDS = (50_000, 20, 100)
gc.set_threshold(*TEST_THRESHOLDS)


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep order


def load_tool(name: str) -> ModuleType:
    """``tools/<name>.py`` as a module (the tools are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

