"""The seed workload behind ``kvsim bench burst-resize`` (its counts, not its timing)."""

from __future__ import annotations

import json

from kvsim.bench.seed_workload import SeedWorkload
from kvsim.cli import main
from kvsim.manager.invariants import check_invariants


def test_seed_workload_offloads_exactly_the_seed_counts():
    mgr, request, (burst,) = SeedWorkload().build()
    outcome = burst.invoke()
    assert outcome.value is True
    plan = outcome.plan
    assert plan.offloaded_pages == 6380
    assert plan.offloaded_bytes == 104_529_920  # 99.69 MiB
    assert plan.counts.pages_allocated == 6380
    assert [c.kind for c in plan.copies] == ["offload"]
    assert request.num_blocks == 6251
    check_invariants(mgr)


def test_without_eviction_nothing_moves():
    mgr, _request, (burst,) = SeedWorkload(fill_gpu=False).build()
    outcome = burst.invoke()
    assert outcome.value is True and outcome.plan.offloaded_pages == 0


def test_a_gpu_tier_too_small_for_the_request_fails_cleanly():
    mgr, _request, (burst,) = SeedWorkload(gpu_pages=512).build()
    outcome = burst.invoke()
    assert outcome.value is False  # 512 slots cannot hold 6380 locked pages
    assert outcome.plan.ok is False
    check_invariants(mgr)


def test_bench_command_prints_the_required_keys(capsys):
    assert main(["bench", "burst-resize", "--runs", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("offloaded_pages", "offloaded_bytes", "median_ms", "no_eviction_median_ms"):
        assert key in out
    assert out["offloaded_pages"] == 6380 and out["offloaded_bytes"] == 104_529_920
    assert out["per_page_stats_commits"] == 6380  # one per page; the allocation stays pending


def test_the_timed_replay_digest_names_every_calls_answer(capsys):
    """``--digest``: equal for two runs of the same replay, different when the replay's calls
    change (a larger decode step: fewer, bigger commits)."""
    from kvsim.bench.replay import main as replay_main

    def digest(*extra: str) -> str:
        assert replay_main(["--timed-only", "--max-requests", "12", "--digest", "--json",
                            *extra]) == 0
        return json.loads(capsys.readouterr().out)["calls_digest"]

    first = digest()
    assert len(first) == 64 and digest() == first
    assert digest("--decode-step-tokens", "64") != first


def test_the_timed_replay_says_how_far_it_is_on_standard_error(capsys, monkeypatch):
    """Progress lines on standard error (every PROGRESS_EVERY_CALLS calls: 50 here), the JSON
    alone on standard output; ``--quiet``: no progress lines."""
    from kvsim.bench.replay import main as replay_main
    from kvsim.runtime import pipeline

    monkeypatch.setattr(pipeline, "PROGRESS_EVERY_CALLS", 50)
    assert replay_main(["--timed-only", "--max-requests", "12", "--json"]) == 0
    out, err = capsys.readouterr()
    calls = json.loads(out)["calls"]
    lines = err.splitlines()
    assert calls >= 100 and len(lines) == calls // 50
    assert lines[0].startswith("timed replay: 50 calls, ") and lines[0].endswith(" s in")
    assert replay_main(["--timed-only", "--max-requests", "12", "--json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["calls"] == calls and err == ""
