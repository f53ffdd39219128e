"""kvsim's Python API in one short script (walked through in docs/python-api.md).

Part 1 runs a shipped scenario on the simulator and reads its results, part 2 builds a scenario
in code, and part 3 drives the manager model directly, with no executor and no clock. Run it
from the repository root (or anywhere: paths are taken from this file's place):

    python examples/python_api.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.results import variant_summary
from kvsim.scenario.run import execute, run_scenario
from kvsim.scenario.schema import parse_scenario
from kvsim.scenario.source import Source

ROOT = Path(__file__).resolve().parents[1]
KIB, MIB = 1 << 10, 1 << 20


def run_shipped_scenario() -> None:
    """Part 1: the main job, scenarios/seed/burst_resize.yaml, on the simulator."""
    # Loading validates the file and every variant (errors name file, line and field). A second
    # argument takes `--set`-style overrides, e.g. ["workload.growth_steps=4"].
    sf = load_scenario_file(ROOT / "scenarios/seed/burst_resize.yaml")
    print(f"scenario {sf.base.name}: executor {sf.base.executor}, hardware {sf.base.hardware}, "
          f"{len(sf.variants)} variants")

    results = run_scenario(sf)  # the scenario as written, then each variant

    # The results object is what `kvsim run` writes as results.json.
    resize = results["api"]["KvCache.resize"]
    summary = variant_summary(results, None)  # the condensed view the variants table shows
    print(f"resize calls: {resize['count']}, p50 host time {resize['latency']['p50_ms']:.3f} ms")
    print(f"copies done (call start to last copy landed), p50: "
          f"{summary['resize_copies_done_p50_ms']:.3f} ms")
    print(f"offloaded during growth: {results['offload']['growth_pages']} pages, "
          f"{results['offload']['growth_bytes'] / MIB:.2f} MiB")
    print(f"reuse hit rate: {results['reuse']['hit_rate']:.3f} (no prompt to reuse in this workload)")
    for name in ("h200_sxm__kernel", "gh200__kernel"):
        v = results["variants"][name]
        print(f"variant {name}: copies done {v['resize_copies_done_p50_ms']:.3f} ms via "
              f"{v['copy_paths']} at {v['resize_copy_gbps']:.1f} GB/s")


def build_a_scenario() -> None:
    """Part 2: a scenario from a mapping (what a YAML file loads to), validated the same way."""
    data = {
        "name": "api_example", "executor": "sim", "hardware": "h200-sxm",
        "manager": {"layers": [{"slot_bytes": ["8 KiB", "8 KiB"]}],
                    "levels": [{"name": "gpu", "quota_bytes": "16 MiB"},
                               {"name": "host", "quota_bytes": "64 MiB"}]},
        "workload": {"kind": "burst_resize", "history_tokens": 20000},
    }
    scenario = parse_scenario(data, Source("<in memory>"))  # errors name the field
    results = execute(scenario)  # one run (no variants)
    latency = results["api"]["KvCache.resize"]["latency"]["p50_ms"]
    print(f"built in code: resize of {scenario.workload.capacity_tokens} tokens took {latency:.3f} ms, "
          f"offloading {results['offload']['pages']} pages")


def drive_the_manager() -> None:
    """Part 3: the manager model itself."""
    # Two layers (full attention and a 4096-token sliding window) of 16 KiB per block each share
    # one pool group; a GPU tier of 128 pages (16 KiB each) and a host tier of 256.
    config = ManagerConfig(
        layers=(LayerConfig(slot_bytes=(8 * KIB, 8 * KIB)),
                LayerConfig(slot_bytes=(8 * KIB, 8 * KIB), window_tokens=4096)),
        levels=(LevelConfig("gpu", 128 * 16 * KIB), LevelConfig("host", 256 * 16 * KIB)),
        tokens_per_block=32)
    manager = KVCacheManager(config)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 2**31, size=1000)  # 1000 tokens: 32 blocks, 2 pages each (64 pages)

    # A request: create (nothing to reuse yet), resume (lock its pages on the GPU), grow, commit
    # its tokens into the radix tree, publish its statistics, close (its blocks stay reusable).
    kv = manager.create_kv_cache(prompt)
    assert kv.resume() and kv.resize(len(prompt))
    kv.commit(prompt)
    kv.commit_pending_stats()
    kv.close()
    print(f"probe_reuse after the first request: {manager.probe_reuse(prompt)} of {len(prompt)} tokens")

    # A second request of 1800 tokens needs 114 pages: its resize must offload 50 of the first
    # request's committed pages to the host tier. `with_plan` returns an Outcome: the value and
    # the Plan (the copy batches an executor would run, and the bookkeeping counts the CPU cost
    # model prices).
    other = manager.create_kv_cache(rng.integers(0, 2**31, size=1800))
    assert other.resume()
    outcome = other.resize.with_plan(1800)
    print(f"second request's resize: ok {outcome.ok}, offloaded {outcome.plan.offloaded_pages} pages "
          f"({outcome.plan.offloaded_bytes // KIB} KiB) in {len(outcome.plan.copies)} batch(es)")
    other.close()

    # The first prompt is still reusable, now from the host tier; creating a cache for it adopts
    # the prefix, and resume() onboards those pages back to the GPU.
    print(f"probe_reuse now: {manager.probe_reuse(prompt)} tokens")
    again = manager.create_kv_cache(prompt)
    resumed = again.resume.with_plan()
    print(f"third request reused {again.num_committed_tokens} tokens; resume onboarded "
          f"{resumed.plan.onboarded_pages} pages")
    stats = again.commit_pending_stats()
    reused, missed = stats["reused_blocks"], stats["missed_blocks"]  # summed over life cycles
    print(f"its statistics: reused {reused} blocks, missed {missed}, "
          f"hit rate {reused / (reused + missed):.2f}")
    again.close()
    gpu = manager.get_storage_statistics(0)[0]
    print(f"GPU tier: {gpu['total']} pages, {gpu['free']} free, {gpu['evictable']} evictable")


if __name__ == "__main__":
    run_shipped_scenario()
    build_a_scenario()
    drive_the_manager()
