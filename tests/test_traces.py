"""Trace files: Mooncake loading and tokens, the op-trace format, and op-trace replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import ConfigError, InvalidArgumentError, InvalidStateError
from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig
from kvsim.runtime.steps import Call, Until
from kvsim.traces import MAX_LISTED_SKIPS, TraceError
from kvsim.traces.mooncake import (
    BLOCK_TOKENS,
    MooncakeRequest,
    block_tokens,
    load_mooncake,
    output_tokens_for,
    tokens_for,
)
from kvsim.traces.op_trace import (
    OPS,
    TraceOp,
    format_op,
    load_op_trace,
    synth_tokens,
    write_op_trace,
)
from kvsim.workloads import op_trace as op_workload

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "scenarios" / "traces"
REAL_TRACE = REPO / "data" / "mooncake" / "mooncake_synthetic_trace.jsonl"


def req(ts: float = 0, inp: int = 1024, out: int = 4, ids=(1, 2)) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out,
                       "hash_ids": list(ids)})


def write(tmp_path: Path, lines: list[str], name: str = "t.jsonl", newline: bool = True) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + ("\n" if newline else ""))
    return path


# -- Mooncake loader: bad lines -----------------------------------------------------------------

@pytest.mark.parametrize("bad, field, rule", [
    ('{"timestamp": 5, "input_length": 10,', None, "malformed JSON"),
    ('[1, 2, 3]', None, "must be a JSON object"),
    (json.dumps({"timestamp": 5, "output_length": 1, "hash_ids": []}), "input_length",
     "required field is missing"),
    (json.dumps({"timestamp": 5, "input_length": "10", "output_length": 1, "hash_ids": [1]}),
     "input_length", "must be an integer"),
    (json.dumps({"timestamp": 5, "input_length": 10, "output_length": -3, "hash_ids": [1]}),
     "output_length", "must be >= 0"),
    (json.dumps({"timestamp": 5, "input_length": -1, "output_length": 3, "hash_ids": []}),
     "input_length", "must be >= 0"),
    (json.dumps({"timestamp": "5", "input_length": 10, "output_length": 3, "hash_ids": [1]}),
     "timestamp", "must be a number"),
    (json.dumps({"timestamp": 5, "input_length": 10, "output_length": True, "hash_ids": [1]}),
     "output_length", "must be an integer"),
    (req(5, 1025, ids=(1, 2, 3, 4)), "hash_ids", "at most ceil(1025 / 512) = 3"),
    (req(5, 1024, ids=(1, "x")), "hash_ids[1]", "must be an integer"),
    (req(5, 1024, ids=(1, -2)), "hash_ids[1]", "must be in [0, 2**63)"),
    (json.dumps({"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": 7}),
     "hash_ids", "must be a list"),
    (req(1), "timestamp", "goes backwards: 1 after 2 (line 2)"),
])
def test_bad_line_names_file_line_and_field(tmp_path, bad, field, rule):
    path = write(tmp_path, [req(0), req(2), bad, req(9)])
    with pytest.raises(TraceError) as info:
        load_mooncake(path)
    message = str(info.value)
    where = f"{path}:3: " + (f"{field}: " if field else "")
    assert message.startswith(where), message
    assert rule in message
    assert isinstance(info.value, ConfigError)
    assert (info.value.line, info.value.field) == (3, field)


def test_skip_bad_lines_counts_and_lists_them(tmp_path):
    lines = [req(0), "{oops", req(5), req(6, -5), req(1), req(6, ids=(1, 2, 3)), req(7)]
    path = write(tmp_path, lines)
    trace = load_mooncake(path, skip_bad_lines=True)
    # line 4: negative input; line 5: timestamp 1 after 5; line 6: 3 ids for 1024 tokens
    assert trace.skipped_lines == 4
    assert [s.line for s in trace.skipped] == [2, 4, 5, 6]
    assert "timestamp: goes backwards" in trace.skipped[2].reason
    assert [r.line for r in trace.requests] == [1, 3, 7]
    assert [r.index for r in trace.requests] == [0, 1, 2]
    assert "skipped 4 bad line(s)" in trace.skip_summary()
    assert "line 2: malformed JSON" in trace.skip_summary()


def test_a_skipped_line_does_not_move_the_clock(tmp_path):
    # line 2 is bad (negative output) with a late timestamp; line 3 must still be accepted.
    path = write(tmp_path, [req(0), req(100, out=-1), req(50)])
    trace = load_mooncake(path, skip_bad_lines=True)
    assert [r.timestamp_ms for r in trace.requests] == [0, 50]


def test_skip_list_is_capped(tmp_path):
    lines = [req(0)] + ["nope"] * (MAX_LISTED_SKIPS + 7)
    trace = load_mooncake(write(tmp_path, lines), skip_bad_lines=True)
    assert trace.skipped_lines == MAX_LISTED_SKIPS + 7
    assert len(trace.skipped) == MAX_LISTED_SKIPS
    assert "... and 7 more" in trace.skip_summary()


def test_empty_and_blank_files_are_errors(tmp_path):
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n")):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(TraceError, match="empty trace"):
            load_mooncake(path, skip_bad_lines=True)


def test_all_lines_bad_is_an_error_even_when_skipping(tmp_path):
    with pytest.raises(TraceError, match="no valid requests: all 2"):
        load_mooncake(write(tmp_path, ["x", "y"]), skip_bad_lines=True)


def test_truncated_last_line_is_an_error_even_when_skipping(tmp_path):
    text = req(0) + "\n" + req(1)[:-9]  # cut mid-line, no final newline
    path = tmp_path / "cut.jsonl"
    path.write_text(text)
    for skip in (False, True):
        with pytest.raises(TraceError, match=r"cut\.jsonl:2: truncated file"):
            load_mooncake(path, skip_bad_lines=skip)


def test_a_complete_last_line_without_newline_is_fine(tmp_path):
    trace = load_mooncake(write(tmp_path, [req(0), req(1)], newline=False))
    assert len(trace) == 2


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_mooncake(tmp_path / "absent.jsonl")


def test_blank_lines_are_ignored_and_line_numbers_kept(tmp_path):
    trace = load_mooncake(write(tmp_path, [req(0), "", req(1)]))
    assert [r.line for r in trace.requests] == [1, 3]


# -- Mooncake tokens --------------------------------------------------------------------------

def make(ids, length, index=0) -> MooncakeRequest:
    return MooncakeRequest(index, index + 1, 0, length, 8, tuple(ids))


def test_tokens_are_deterministic_uint32_of_the_input_length():
    r = make([5, 6, 7], 1300)
    a, b = tokens_for(r), tokens_for(make([5, 6, 7], 1300, index=9))
    assert a.dtype == np.uint32 and a.size == 1300
    assert np.array_equal(a, b)  # depends on the ids only, not on the request
    assert np.array_equal(a, tokens_for(r))


def test_equal_ids_share_blocks_and_different_ids_differ_everywhere():
    a = tokens_for(make([1, 2, 3], 3 * 512))
    b = tokens_for(make([1, 2, 9], 3 * 512))
    c = tokens_for(make([2, 1], 2 * 512))
    assert np.array_equal(a[:1024], b[:1024])
    assert (a[1024:] != b[1024:]).all()  # every position of the differing block differs
    assert np.array_equal(c[:512], a[512:1024])  # a block's tokens do not depend on its position
    blocks = block_tokens(np.arange(2000))
    assert np.unique(blocks[:, 0]).size == 2000  # distinct ids: distinct first tokens


def test_partial_last_block_is_a_prefix_of_the_full_block():
    full = tokens_for(make([4, 8], 1024))
    part = tokens_for(make([4, 8], 700))
    assert np.array_equal(part, full[:700])


def test_blocks_without_ids_are_private_to_their_request():
    a = tokens_for(make([1], 1024, index=0))
    b = tokens_for(make([1], 1024, index=1))
    assert np.array_equal(a[:512], b[:512])
    assert (a[512:] != b[512:]).mean() > 0.99


def test_output_tokens_are_per_request_and_sliceable():
    r, s = make([1], 512, index=3), make([1], 512, index=4)
    out = output_tokens_for(r)
    assert out.size == r.output_length and out.dtype == np.uint32
    assert np.array_equal(output_tokens_for(r, 3, 4), out[3:7])
    assert not np.array_equal(out, output_tokens_for(s))


def test_sample_traces_load():
    assert len(load_mooncake(SAMPLES / "mooncake_handmade.jsonl")) == 6
    sample = load_mooncake(SAMPLES / "mooncake_sample.jsonl")
    assert len(sample) == 16 and sample.skipped_lines == 0


def test_real_trace_loads_fast_and_whole():
    import time

    t0 = time.perf_counter()
    trace = load_mooncake(REAL_TRACE)
    total = sum(tokens_for(r).size for r in trace.requests)
    wall = time.perf_counter() - t0
    assert len(trace) == 3993 and trace.skipped_lines == 0
    assert total == trace.input_tokens
    assert all(len(r.hash_ids) == -(-r.input_length // BLOCK_TOKENS) for r in trace.requests)
    assert wall < 5.0  # about 0.15 s on a 2-core machine; generous for loaded CI hosts


# -- op-trace format --------------------------------------------------------------------------

ALL_OPS = [
    TraceOp(0.0, "a", "create_kv_cache", cache="c1", token_count=40, token_seed=3),
    TraceOp(0.0, "a", "resume", cache="c1"),
    TraceOp(0.5, "a", "resize", cache="c1", capacity=64, history_length=40),
    TraceOp(0.5, "a", "commit", cache="c1", token_count=40, token_seed=3, ok=True,
            duration_s=1.5e-05),
    TraceOp(0.75, "a", "commit", cache="c1", tokens=(1, 2, 3, 4294967295)),
    TraceOp(0.75, "a", "stop_committing", cache="c1"),
    TraceOp(0.75, "a", "commit_pending_stats", cache="c1"),
    TraceOp(1, "a", "suspend", cache="c1"),
    TraceOp(0.25, "b", "probe_reuse", token_count=16, token_seed=3, token_offset=0, scope=0,
            result=16),
    TraceOp(0.3, "b", "create_kv_cache", cache="c2", tokens=(9, 8), scope="tenant-1"),
    TraceOp(0.3, "b", "resize", cache="c2", capacity=8),
    TraceOp(2, "a", "close", cache="c1", ok=False, error="InvalidStateError: boom"),
    TraceOp(2.5, "b", "get_and_reset_iteration_stats"),
]


def test_every_op_is_covered_by_the_round_trip_sample():
    assert {op.op for op in ALL_OPS} == set(OPS)


def test_write_then_load_round_trips(tmp_path):
    path = tmp_path / "ops.jsonl"
    assert write_op_trace(path, ALL_OPS) == len(ALL_OPS)
    trace = load_op_trace(path)
    assert list(trace.ops) == ALL_OPS
    assert [op.line for op in trace.ops] == list(range(1, len(ALL_OPS) + 1))
    again = tmp_path / "again.jsonl"
    write_op_trace(again, trace.ops)
    assert again.read_bytes() == path.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_shipped_example_round_trips_byte_for_byte(tmp_path):
    src = SAMPLES / "op_trace_example.jsonl"
    trace = load_op_trace(src)
    out = tmp_path / "copy.jsonl"
    write_op_trace(out, trace.ops)
    assert out.read_text() == src.read_text()


def test_writer_aborts_cleanly(tmp_path):
    from kvsim.traces.op_trace import OpTraceWriter

    path = tmp_path / "w.jsonl"
    with pytest.raises(RuntimeError):
        with OpTraceWriter(path) as w:
            w.write(ALL_OPS[0])
            raise RuntimeError("recording interrupted")
    assert list(tmp_path.iterdir()) == []


def test_format_op_key_order():
    line = format_op(TraceOp(1.5, "t", "resize", cache="x", capacity=9))
    assert line == '{"t": 1.5, "thread": "t", "op": "resize", "cache": "x", "capacity": 9}'


@pytest.mark.parametrize("obj, field, rule", [
    ({"t": 0, "thread": "a", "op": "fly"}, "op", "must be one of create_kv_cache"),
    ({"t": 0, "thread": "a", "op": "resume"}, "cache", "required field is missing (resume needs it)"),
    ({"t": 0, "thread": "a", "op": "resume", "cache": 3}, "cache", "must be a string"),
    ({"t": 0, "thread": "a", "op": "probe_reuse", "cache": "x", "token_count": 1}, "cache",
     "not an argument of probe_reuse"),
    ({"t": 0, "thread": "a", "op": "commit", "cache": "x"}, "tokens", "required field is missing"),
    ({"t": 0, "thread": "a", "op": "commit", "cache": "x", "tokens": [1, -1]}, "tokens.1",
     "[0, 2**32)"),
    ({"t": 0, "thread": "a", "op": "commit", "cache": "x", "tokens": [1], "token_seed": 1},
     "token_seed", "not both"),
    ({"t": 0, "thread": "a", "op": "commit", "cache": "x", "token_seed": 1}, "token_count",
     "required field is missing"),
    ({"t": 0, "thread": "a", "op": "resize", "cache": "x"}, "capacity", "required field is missing"),
    ({"t": 0, "thread": "a", "op": "resize", "cache": "x", "capacity": -4}, "capacity",
     "must be in [0, 67108864], got -4"),
    ({"t": 0, "thread": "a", "op": "commit", "cache": "x", "token_count": 1, "capacity": 3},
     "capacity", "not an argument of commit"),
    ({"t": 0, "thread": "a", "op": "resume", "cache": "x", "scope": 0}, "scope",
     "not an argument of resume"),
    ({"t": 0, "thread": "a", "op": "resume", "cache": "x", "tokenz": [1]}, "tokenz", "unknown key"),
    ({"t": -1, "thread": "a", "op": "resume", "cache": "x"}, "t", ">= 0"),
    ({"thread": "a", "op": "resume", "cache": "x"}, "t", "required field is missing"),
    ({"t": 0, "thread": "", "op": "resume", "cache": "x"}, "thread", "non-empty string"),
    ({"t": 0.5, "thread": "a", "op": "resume", "cache": "x"}, "t", "goes backwards on thread 'a'"),
])
def test_op_trace_bad_lines(tmp_path, obj, field, rule):
    first = {"t": 1, "thread": "a", "op": "get_and_reset_iteration_stats"}
    other = {"t": 0, "thread": "b", "op": "get_and_reset_iteration_stats"}  # other threads: own clock
    path = write(tmp_path, [json.dumps(first), json.dumps(other), json.dumps(obj)])
    with pytest.raises(TraceError) as info:
        load_op_trace(path)
    assert str(info.value).startswith(f"{path}:3: {field}: "), str(info.value)
    assert rule in str(info.value)
    skipped = load_op_trace(path, skip_bad_lines=True)
    assert skipped.skipped_lines == 1 and skipped.skipped[0].line == 3
    assert len(skipped.ops) == 2


def test_synth_tokens_share_prefixes_and_continue_with_offsets():
    a = synth_tokens(7, 100)
    assert a.dtype == np.uint32
    assert np.array_equal(synth_tokens(7, 40), a[:40])
    assert np.array_equal(synth_tokens(7, 30, offset=60), a[60:90])
    assert (synth_tokens(8, 100) != a).mean() > 0.99


# -- op-trace replay ----------------------------------------------------------------------------

def tiny_manager(gpu_pages: int = 64, tpb: int = 4) -> KVCacheManager:
    return KVCacheManager(ManagerConfig(
        layers=(LayerConfig(slot_bytes=(64,)),), levels=(LevelConfig("gpu", gpu_pages * 64),),
        tokens_per_block=tpb))


def drive(threads, order=None):
    """Invoke each thread's calls by hand, threads one after another; log (thread, until, api, result)."""
    log = []
    for name in order or sorted(threads):
        until = None
        for step in threads[name]:
            if isinstance(step, Until):
                until = step.time
            else:
                assert isinstance(step, Call)
                outcome = step.invoke()
                result = outcome.value if outcome.error is None else outcome.error
                log.append((name, until, step.api.label, result))
    return log


def test_op_trace_replays_calls_in_order_on_a_manager(tmp_path):
    ops = [
        TraceOp(0.0, "w", "create_kv_cache", cache="c", token_count=16, token_seed=1),
        TraceOp(0.0, "w", "resume", cache="c"),
        TraceOp(0.1, "w", "resize", cache="c", capacity=20, history_length=16),
        TraceOp(0.2, "w", "commit", cache="c", token_count=16, token_seed=1),
        TraceOp(0.3, "w", "suspend", cache="c"),
        TraceOp(0.4, "w", "close", cache="c"),
        TraceOp(1.0, "r", "probe_reuse", token_count=16, token_seed=1),
        TraceOp(1.5, "r", "probe_reuse", token_count=12, token_seed=1, token_offset=4),
    ]
    path = tmp_path / "ops.jsonl"
    write_op_trace(path, ops)
    mgr = tiny_manager()
    wl = op_workload.workload(mgr.config, op_workload.OpTraceWorkload(str(path)), mgr, seed=0)
    assert list(wl.setup) == []
    threads = wl.make_threads()
    assert sorted(threads) == ["r", "w"]
    log = drive(threads, order=["w", "r"])
    assert [(t, u, api) for t, u, api, _ in log] == [
        ("w", 0.0, "KVCacheManager.create_kv_cache"),
        ("w", 0.0, "KvCache.resume"),
        ("w", 0.1, "KvCache.resize"),
        ("w", 0.2, "KvCache.commit"),
        ("w", 0.3, "KvCache.suspend"),
        ("w", 0.4, "KvCache.close"),
        ("r", 1.0, "KVCacheManager.probe_reuse"),
        ("r", 1.5, "KVCacheManager.probe_reuse"),
    ]
    assert log[1][3] is True and log[2][3] is True
    assert log[6][3] == 16  # the committed blocks are reusable after close
    assert log[7][3] == 0  # a shifted stream shares no prefix
    assert mgr.num_open_caches == 0


def test_op_trace_unknown_cache_fails_clearly_naming_the_line(tmp_path):
    path = write(tmp_path, [
        json.dumps({"t": 0, "thread": "a", "op": "create_kv_cache", "cache": "x"}),
        json.dumps({"t": 0, "thread": "a", "op": "resume", "cache": "y"}),
        json.dumps({"t": 0, "thread": "a", "op": "resize", "cache": "x", "capacity": 8}),
    ])
    mgr = tiny_manager()
    wl = op_workload.workload(mgr.config, op_workload.OpTraceWorkload(str(path)), mgr, seed=0)
    log = drive(wl.make_threads())
    unknown = log[1][3]
    assert isinstance(unknown, op_workload.UnknownCacheError)
    assert isinstance(unknown, InvalidArgumentError)
    assert str(unknown).startswith(f"{path}:2: resume: unknown cache 'y'")
    # the manager's own refusal (resize of a SUSPENDED cache) also names the trace line
    refused = log[2][3]
    assert isinstance(refused, InvalidStateError)
    assert str(refused).startswith(f"{path}:3: resize: ")


def test_op_trace_through_the_sim_executor_records_failed_calls(tmp_path):
    from kvsim.hardware import load_hardware
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.sim.executor import SimExecutor

    src = SAMPLES / "op_trace_example.jsonl"
    text = src.read_text() + json.dumps({"t": 0.008, "thread": "client1", "op": "resume",
                                         "cache": "ghost"}) + "\n"
    path = tmp_path / "ops.jsonl"
    path.write_text(text)
    mgr = KVCacheManager(ManagerConfig(
        layers=(LayerConfig(slot_bytes=(4096, 4096)),), levels=(LevelConfig("gpu", 64 * 8192),),
        tokens_per_block=32))
    wl = op_workload.workload(mgr.config, op_workload.OpTraceWorkload(str(path)), mgr, seed=0)
    run = SimExecutor(mgr, load_hardware("h200-sxm"), load_cpu_model("kvcm2-cpp")).run(
        wl.make_threads())
    assert len(run.calls) == 19
    failed = [c for c in run.calls if not c.ok]
    assert [c.args["line"] for c in failed] == [19]
    assert "UnknownCacheError" in failed[0].error and f"{path}:19: resume" in failed[0].error
    probes = [c for c in run.calls if c.api == "KVCacheManager.probe_reuse"]
    assert probes[0].start >= 0.001 - 1e-12
    assert mgr.num_open_caches == 0


def test_the_scalar_mix_is_the_array_mix() -> None:
    """A token stream's base is mixed in Python integers (``_mix64_int``, for speed) and its
    tokens with numpy (``mix64``): the two give the same 64-bit values, wrap-around included."""
    from kvsim.traces import _MASK64, _mix64_int, mix64

    rng = np.random.default_rng(7)
    values = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, _MASK64 - 1, _MASK64]
    values += [int(v) for v in rng.integers(0, 2**63, size=2000, dtype=np.int64)]
    values += [int(v) | (1 << 63) for v in rng.integers(0, 2**63, size=2000, dtype=np.int64)]
    expected = mix64(np.array(values, dtype=np.uint64)).tolist()
    assert [_mix64_int(v) for v in values] == expected
