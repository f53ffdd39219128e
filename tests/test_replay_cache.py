"""Cache-only replay (hit rate against capacity), its CLI, and the timed Mooncake workload."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from kvsim.cli import main
from kvsim.errors import ConfigError
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.replay.cache_only import (
    cache_only_config,
    capacity_curve,
    max_hit_rate,
    max_reuse,
    replay_cache,
)
from kvsim.runtime.steps import Call, Sleep, Until
from kvsim.traces.mooncake import MooncakeRequest, MooncakeTrace, load_mooncake
from kvsim.workloads import mooncake as mooncake_workload

REPO = Path(__file__).resolve().parents[1]
HANDMADE = REPO / "scenarios" / "traces" / "mooncake_handmade.jsonl"
SAMPLE = REPO / "scenarios" / "traces" / "mooncake_sample.jsonl"
REAL_TRACE = REPO / "data" / "mooncake" / "mooncake_synthetic_trace.jsonl"

# The hand-made trace (512-token blocks; a cache of 2048 tokens = 4 blocks), worked by hand:
#   r0 [1,2]  1024: nothing cached, reuses 0.          cache: 1, 1-2
#   r1 [1,3]  1024: reuses block 1 (512).              cache: 1, 1-2, 1-3
#   r2 [4,5]  1024: reuses 0; needs 2 slots, 1 free: evicts 1-2 (least recently used).
#                                                      cache: 1, 1-3, 4, 4-5
#   r3 [1,2]  1024: reuses block 1 only (1-2 is gone); evicts 1-3 (1 is in use).
#                                                      cache: 1, 1-2, 4, 4-5
#   r4 [4,5]  1000: its second block is partial (488 tokens): reuses 4 only (512); the partial
#                   block needs a slot: evicts 4-5 (older than 1, 1-2); freed at close.
#                                                      cache: 1, 1-2, 4
#   r5 [1,2,7,8,9] 2560: 5 blocks > 4 slots: probed only, reuses 1, 1-2 (1024), caches nothing.
# reused = 0 + 512 + 0 + 512 + 512 + 1024 = 2560 of 7656 input tokens.
# Infinite cache: 0 + 512 + 0 + 1024 + 512 + 1024 = 3072.
HAND_INPUT = 1024 * 4 + 1000 + 2560
HAND_REUSED_2048 = 2560
HAND_REUSED_INFINITE = 3072


def test_hand_made_trace_at_a_capacity_that_forces_evictions():
    trace = load_mooncake(HANDMADE)
    result = replay_cache(trace, 2048)
    assert result.input_tokens == HAND_INPUT
    assert result.reused_tokens == HAND_REUSED_2048
    assert result.hit_rate == pytest.approx(HAND_REUSED_2048 / HAND_INPUT)
    assert result.capacity_blocks == 4
    assert result.oversized_requests == 1
    assert result.dropped_blocks == 3  # 1-2 (by r2), 1-3 (by r3), 4-5 (by r4)


def test_hand_made_trace_state_after_replay():
    trace = load_mooncake(HANDMADE)
    mgr = KVCacheManager(cache_only_config(2048))
    replay_cache(trace, 2048, manager=mgr)
    from kvsim.traces.mooncake import tokens_for

    r = trace.requests
    assert mgr.probe_reuse(tokens_for(r[0])) == 1024  # 1, 1-2 cached
    assert mgr.probe_reuse(tokens_for(r[1])) == 512  # 1-3 evicted
    assert mgr.probe_reuse(tokens_for(r[2])) == 512  # 4 cached, 4-5 evicted
    assert mgr.num_open_caches == 0


def test_max_hit_rate_by_hand_and_equal_to_an_infinite_replay():
    trace = load_mooncake(HANDMADE)
    assert max_reuse(trace) == (HAND_REUSED_INFINITE, HAND_INPUT)
    big = replay_cache(trace, HAND_INPUT)
    assert big.reused_tokens == HAND_REUSED_INFINITE
    assert big.dropped_blocks == 0 and big.oversized_requests == 0
    assert max_hit_rate(trace) == pytest.approx(big.hit_rate)


@pytest.mark.parametrize("tpb", [32, 100, 512, 1024])
def test_max_reuse_matches_an_infinite_replay_for_any_block_size(tpb):
    trace = load_mooncake(SAMPLE)
    big = replay_cache(trace, trace.input_tokens + 2048, tokens_per_block=tpb)
    assert max_reuse(trace, tpb) == (big.reused_tokens, big.input_tokens)
    assert big.reused_tokens > 0


def test_hit_rate_grows_with_capacity():
    trace = load_mooncake(SAMPLE)
    rates = [replay_cache(trace, c).hit_rate for c in (4096, 8192, 16384, 10**6)]
    assert rates == sorted(rates)
    assert rates[-1] == pytest.approx(max_hit_rate(trace))


def test_bad_capacity_is_a_config_error():
    trace = load_mooncake(HANDMADE)
    with pytest.raises(ConfigError, match="holds no block"):
        replay_cache(trace, 100)
    with pytest.raises(ConfigError, match="tokens_per_block"):
        replay_cache(trace, 4096, tokens_per_block=0)


def test_capacity_curve_shape():
    curve = capacity_curve(load_mooncake(HANDMADE), [2048, 4096])
    assert sorted(curve) == ["max_hit_rate", "results"]
    assert [r["capacity_tokens"] for r in curve["results"]] == [2048, 4096]


# -- the block LRU (the default engine) against the manager itself -----------------------------

def both_engines(trace, capacity, tpb=512):
    lru = replay_cache(trace, capacity, tpb)
    assert lru == replay_cache(trace, capacity, tpb, engine="manager")
    return lru


@pytest.mark.parametrize("path", [HANDMADE, SAMPLE])
def test_lru_engine_gives_the_managers_results(path):
    trace = load_mooncake(path)
    dropped = set()
    for capacity in range(2048, 24_577, 1536):
        dropped.add(both_engines(trace, capacity).dropped_blocks)
    assert len(dropped) >= 3  # capacities that evict more and less


@pytest.mark.parametrize("tpb", [16, 100, 333, 512, 700])
def test_lru_engine_gives_the_managers_results_at_other_block_sizes(tpb):
    trace = load_mooncake(SAMPLE)
    for capacity in (3 * tpb, 10 * tpb, 40 * tpb, 10**6):
        both_engines(trace, capacity, tpb)


def colliding_trace(seed: int, n: int = 60) -> MooncakeTrace:
    """Requests drawn to collide: few hash ids, shared prefixes, partial last blocks of hash ids
    other requests hold whole, prompts longer than their hash ids (own tail tokens)."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        blocks = rng.randint(1, 6)
        ids = tuple(rng.choice((1, 2, 3)) if b == 0 else rng.randint(1, 5) for b in range(blocks))
        length = rng.choice((512 * blocks, 512 * blocks - rng.randint(1, 511),
                             512 * (blocks + 1) - rng.randint(1, 511)))
        requests.append(MooncakeRequest(i, i + 1, float(i), length, 1, ids))
    return MooncakeTrace(f"colliding-{seed}", tuple(requests), n, 0, ())


@pytest.mark.parametrize("seed", range(12))
def test_lru_engine_gives_the_managers_results_on_colliding_traces(seed):
    trace = colliding_trace(seed)
    for tpb in (512, 200):
        for slots in (3, 5, 8, 13, 40):
            both_engines(trace, slots * tpb, tpb)


def test_the_block_lru_drops_a_block_with_everything_below_it():
    """Not reached by a replay (a block is never older than the blocks below it, so they go
    first), but kept exact: a deep chain and a partial sibling go with their prefix."""
    from kvsim.replay.block_lru import BlockLru

    lru = BlockLru(slots=5000, tokens_per_block=1)
    chain = np.arange(3000, dtype="<u4").tobytes()  # 3000 one-token blocks, one chain
    assert lru.request(chain, 0, probe_only=False) == (0, 0)
    other = np.array([0, 1, 7, 8], dtype="<u4").tobytes()  # shares the first two blocks
    assert lru.request(other, 2, probe_only=False) == (2, 0)
    assert lru.used == len(lru.tick) == 3002
    first = next(b for b, parent in lru.parent.items() if parent == 0)  # the top block
    lru._remove(first)
    assert lru.used == len(lru.tick) == len(lru.order) == 0
    assert not any(lru.fulls.values()) and not any(lru.partials.values())
    assert lru.request(chain, 4, probe_only=True) == (0, 0)


def test_unknown_engine_is_refused():
    with pytest.raises(ConfigError, match="engine must be one of lru, manager"):
        replay_cache(load_mooncake(HANDMADE), 2048, engine="dict")


# -- the CLI -------------------------------------------------------------------------------------

def test_cli_json_shape(capsys):
    assert main(["replay-cache", str(HANDMADE), "--format", "mooncake", "--capacity-tokens",
                 "2048", "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert set(out) == {"results", "max_hit_rate"}
    (row,) = out["results"]
    assert {"capacity_tokens", "input_tokens", "reused_tokens", "hit_rate"} <= set(row)
    assert (row["capacity_tokens"], row["input_tokens"], row["reused_tokens"]) == (
        2048, HAND_INPUT, HAND_REUSED_2048)
    assert row["hit_rate"] == HAND_REUSED_2048 / HAND_INPUT
    assert out["max_hit_rate"] == HAND_REUSED_INFINITE / HAND_INPUT
    assert captured.err == ""


def test_cli_several_capacities_write_curve_and_results_deterministically(tmp_path, capsys):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["replay-cache", str(SAMPLE), "--capacity-tokens", "4k,8192,16K,1M",
                     "--out", str(out)]) == 0
        assert sorted(p.name for p in out.iterdir()) == [".kvsim-output", "hit_rate.png",
                                                         "results.json"]
        outs.append(out)
    for f in ("hit_rate.png", "results.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes()
    saved = json.loads((outs[0] / "results.json").read_text())
    assert [r["capacity_tokens"] for r in saved["results"]] == [4000, 8192, 16000, 1000000]
    captured = capsys.readouterr()
    assert "infinite" in captured.out  # the table
    assert "capacity 4000 tokens" in captured.err  # progress


def test_cli_bad_trace_exits_2_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(HANDMADE.read_text() + '{"timestamp": 1, "input_length": 5}\n')
    assert main(["replay-cache", str(bad), "--capacity-tokens", "2048", "--json"]) == 2
    assert f"{bad}:7: output_length: required field is missing" in capsys.readouterr().err
    assert main(["replay-cache", str(bad), "--capacity-tokens", "2048", "--json", "--quiet",
                 "--skip-bad-lines"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["results"][0]["reused_tokens"] == HAND_REUSED_2048
    assert "skipped 1 bad line(s): line 7" in captured.err


def test_cli_rejects_bad_capacities(capsys):
    with pytest.raises(SystemExit):
        main(["replay-cache", str(HANDMADE), "--capacity-tokens", "lots"])
    assert "expected a token count" in capsys.readouterr().err
    assert main(["replay-cache", str(HANDMADE), "--capacity-tokens", "100", "--quiet"]) == 2


def test_real_trace_paper_claim_at_3m_tokens():
    """Mooncake Fig. 9: with 3M tokens the LRU hit rate is under half the infinite-cache maximum."""
    trace = load_mooncake(REAL_TRACE)
    best = max_hit_rate(trace)
    at_3m = both_engines(trace, 3_000_000)
    assert at_3m.hit_rate < best / 2
    assert at_3m.hit_rate > best / 4  # and not absurdly low


# -- the timed Mooncake workload ---------------------------------------------------------------

def manager_for_timed(gpu_blocks: int, host_blocks: int | None = None, tpb: int = 32) -> KVCacheManager:
    page = 512
    levels = [LevelConfig("gpu", gpu_blocks * page)]
    if host_blocks is not None:
        levels.append(LevelConfig("host", host_blocks * page))
    return KVCacheManager(ManagerConfig(layers=(LayerConfig(slot_bytes=(256, 256)),),
                                        levels=tuple(levels), tokens_per_block=tpb))


def test_timed_workload_steps_of_one_request():
    mgr = manager_for_timed(4096)
    spec = mooncake_workload.MooncakeReplayWorkload(
        trace=str(HANDMADE), max_requests=1, decode_step_tokens=3,
        decode_token_interval_us=1000.0)
    wl, stats = mooncake_workload.build(mgr.config, spec, mgr)
    (name, steps), = wl.make_threads().items()
    assert name == "req00000"
    log = []
    for step in steps:
        if isinstance(step, Call):
            step.invoke()
            log.append((step.phase, step.api.label.split(".")[1]))
        else:
            log.append(type(step).__name__ + f"({getattr(step, 'time', getattr(step, 'seconds', 0))})")
    assert log == [
        "Until(0.0)",
        ("arrival", "probe_reuse"), ("prefill", "create_kv_cache"), ("prefill", "resume"),
        ("prefill", "resize"), ("prefill", "commit"), ("prefill", "resize"),
        ("prefill", "commit_pending_stats"),
        "Sleep(0.003)", ("decode", "resize"), ("decode", "commit"),
        "Sleep(0.001)", ("decode", "resize"), ("decode", "commit"),
        ("finish", "commit_pending_stats"), ("finish", "suspend"), ("finish", "close"),
    ]
    assert stats.completed == 1 and stats.output_tokens == 4 and stats.input_tokens == 1024
    assert mgr.num_open_caches == 0


def run_sim(mgr, spec, check: bool = True):
    from kvsim.hardware import load_hardware
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.sim.executor import SimExecutor, SimOptions

    wl, stats = mooncake_workload.build(mgr.config, spec, mgr)
    options = SimOptions(check_invariants=check, check_lock_discipline=check)
    run = SimExecutor(mgr, load_hardware("h200-sxm"), load_cpu_model("kvcm2-cpp"), options).run(
        wl.make_threads())
    return run, stats


def test_timed_replay_through_the_sim_executor():
    # 128 tokens per block keeps the invariant checks (after every exclusive call) cheap
    mgr = manager_for_timed(1024, 2048, tpb=128)
    spec = mooncake_workload.MooncakeReplayWorkload(trace=str(SAMPLE), decode_step_tokens=8)
    run, stats = run_sim(mgr, spec)
    assert stats.requests == stats.completed == 16
    assert all(c.ok for c in run.calls), [c.error for c in run.calls if not c.ok]
    assert not run.stuck and not run.violations
    trace = load_mooncake(SAMPLE)
    assert stats.output_tokens == trace.output_tokens
    # arrivals follow the timestamps (250 ms apart)
    probes = [c for c in run.calls if c.api == "KVCacheManager.probe_reuse"]
    assert [round(c.start, 6) for c in probes] == [i * 0.25 for i in range(16)]
    assert stats.reused_tokens > 0 and stats.probed_tokens >= stats.reused_tokens
    assert mgr.num_open_caches == 0


def test_timed_replay_with_a_client_pool():
    mgr = manager_for_timed(4096, 8192)
    spec = mooncake_workload.MooncakeReplayWorkload(trace=str(SAMPLE), client_threads=2,
                                                    decode_token_interval_us=100_000.0)
    run, stats = run_sim(mgr, spec, check=False)
    assert sorted({c.thread for c in run.calls}) == ["client000", "client001"]
    assert stats.completed == 16
    # each request lasts >= 2 s of decode, two clients: later requests start late (queueing)
    probes = [c for c in run.calls if c.api == "KVCacheManager.probe_reuse"]
    assert probes[-1].start > 15 * 0.25 + 1.0


def test_timed_replay_out_of_pages_is_recorded_not_fatal():
    # 200 blocks of 32 tokens and no host tier: the larger requests cannot fit alongside others
    mgr = manager_for_timed(200)
    spec = mooncake_workload.MooncakeReplayWorkload(trace=str(SAMPLE), time_scale=0.01,
                                                    decode_token_interval_us=50_000.0)
    run, stats = run_sim(mgr, spec)
    assert stats.requests == 16
    failed = stats.resume_failed + stats.resize_failed
    assert failed > 0 and stats.completed == 16 - failed
    bad = [c for c in run.calls if not c.ok]
    assert bad and all(c.api in ("KvCache.resize", "KvCache.resume") for c in bad)
    assert mgr.num_open_caches == 0  # failed requests closed their caches
    assert not run.violations


def test_timed_workload_rejects_bad_settings():
    from kvsim.validation import dotted, validate

    def check(**fields):
        return validate(mooncake_workload.MooncakeReplayWorkload, {"trace": "x", **fields},
                        lambda loc, message: ConfigError(f"{dotted(loc)}: {message}"))

    assert check(decode_step_tokens=8).decode_step_tokens == 8
    with pytest.raises(ConfigError, match=r"decode_step_tokens: must be in \[1, 67108864\]"):
        check(decode_step_tokens=0)
    with pytest.raises(ConfigError, match=r"client_threads: must be in \[1, 1024\]"):
        check(client_threads=0)
    with pytest.raises(ConfigError, match=r"time_scale: must be in \[0.0, 1000000000.0\]"):
        check(time_scale=-1.0)


def test_timed_workload_steps_are_lazy():
    """Tokens are made on arrival, not when the threads are built (3,993 requests stay cheap)."""
    mgr = manager_for_timed(4096)
    spec = mooncake_workload.MooncakeReplayWorkload(trace=str(SAMPLE))
    wl, stats = mooncake_workload.build(mgr.config, spec, mgr)
    threads = wl.make_threads()
    assert len(threads) == 16 and stats.requests == 0
    first = next(threads["req00003"])
    assert isinstance(first, Until) and first.time == pytest.approx(0.75)
    assert not isinstance(first, Sleep)


def test_timed_workload_without_the_arrival_probe():
    mgr = manager_for_timed(4096)
    spec = mooncake_workload.MooncakeReplayWorkload(trace=str(HANDMADE), max_requests=2,
                                                    probe_on_arrival=False, decode_resize=False)
    wl, stats = mooncake_workload.build(mgr.config, spec, mgr)
    apis = []
    for _, steps in sorted(wl.make_threads().items()):
        for step in steps:
            if isinstance(step, Call):
                step.invoke()
                apis.append(step.api.label)
    assert "KVCacheManager.probe_reuse" not in apis
    assert apis.count("KvCache.resize") == 4  # prefill only: the prompt, then the output
    assert stats.completed == 2 and stats.reused_tokens == 512  # r1 reuses block 1
