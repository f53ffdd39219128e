"""trace.json (kvsim.report.perfetto): shipped timed scenarios run through the real executors,
the results directory written, and the trace read back as Perfetto would read it."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from kvsim.report.perfetto import trace_events, write_trace
from kvsim.report.results_dir import write_results_into
from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import execute, run_scenario

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "scenarios" / "concurrency" / "probe_during_resize.yaml"
GIL_DEADLOCK = REPO / "scenarios" / "bugs" / "gil_deadlock.yaml"
SMALL = ["workload.probes_per_thread=5", "workload.probe_threads=3"]
EPS_US = 2e-3  # times are rounded to whole nanoseconds
META_NAMES = {"process_name", "process_sort_index", "process_labels", "thread_name",
              "thread_sort_index"}


def run_into(out: Path, path: Path = PROBE, overrides: list[str] = SMALL) -> dict:
    results = run_scenario(load_scenario_file(path, overrides))
    out.mkdir(parents=True)
    write_results_into(results, out)
    return results


def read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory) -> tuple[dict, Path, dict]:
    out = tmp_path_factory.mktemp("perfetto") / "sim"
    results = run_into(out)
    return results, out, read(out / "trace.json")


def slices(trace: dict, pid: int | None = None, cat: str | None = None) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"
            and (pid is None or e["pid"] == pid) and (cat is None or e["cat"] == cat)]


def process_names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def track_names(trace: dict, process: str) -> dict[int, str]:
    pid = {v: k for k, v in process_names(trace).items()}[process]
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def test_every_event_has_the_format_s_keys_and_types(sim_run):
    _, _, trace = sim_run
    # Perfetto stops reading at a top-level key it does not know
    assert set(trace) == {"traceEvents", "otherData"}
    assert trace["traceEvents"]
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"]
        assert type(e["pid"]) is int and type(e["tid"]) is int
        assert isinstance(e["args"], dict)
        assert not any(isinstance(v, list) for v in e.values())
        if e["ph"] == "M":
            assert e["name"] in META_NAMES
            assert "ts" not in e
        else:
            assert e["ph"] == "X", e
            assert isinstance(e["cat"], str)
            for key in ("ts", "dur"):
                assert isinstance(e[key], (int, float)) and not isinstance(e[key], bool)
                assert e[key] >= 0


def test_times_are_microseconds_of_the_results_clock(sim_run):
    results, _, trace = sim_run
    end_us = results["sim"]["end_time_s"] * 1e6
    assert trace["otherData"]["end_time_us"] == pytest.approx(end_us, abs=EPS_US)
    for e in slices(trace):
        assert e["ts"] + e["dur"] <= end_us + EPS_US
    by_index = {e["args"]["index"]: e for e in slices(trace, cat="call")}
    for c in results["calls"]:
        assert by_index[c["index"]]["ts"] == pytest.approx(c["start_ms"] * 1e3, abs=EPS_US)
        assert by_index[c["index"]]["dur"] == pytest.approx(c["latency_ms"] * 1e3, abs=EPS_US)


def test_each_workload_thread_has_a_call_track_a_lock_track_and_a_gil_track(sim_run):
    results, _, trace = sim_run
    assert process_names(trace) == {1: "threads", 2: "copies"}
    tracks = track_names(trace, "threads")
    threads = sorted({c["thread"] for c in results["calls"]})
    assert len(threads) == 4  # three probers and the resize
    # tids in sorted thread-name order: each thread's calls, then its lock, then its GIL
    assert list(tracks.values()) == [n for t in threads
                                     for n in (t, f"{t} / lock", f"{t} / GIL")]
    assert sorted(tracks) == list(tracks)
    all_tids = [e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert len(all_tids) == len(set(all_tids))  # Perfetto keys threads by tid alone
    assert not set(all_tids) & set(process_names(trace))
    for e in slices(trace, pid=1):
        assert e["tid"] in tracks


def test_gil_holds_of_the_simulator_are_on_each_thread_s_gil_track(sim_run):
    """One slice per recorded hold, on its thread's GIL track; holds of one thread never overlap,
    and every call's Python (it holds the GIL on entry) lies after some hold began."""
    results, _, trace = sim_run
    holds = results["_gil_holds"]
    assert holds, "the simulator records GIL holds"
    tracks = {name: tid for tid, name in track_names(trace, "threads").items()}
    gil = slices(trace, pid=1, cat="gil")
    assert len(gil) == sum(1 for t, a, b in holds if b > a and f"{t} / GIL" in tracks)
    for e in gil:
        assert track_names(trace, "threads")[e["tid"]].endswith(" / GIL")
    # no two threads hold the GIL at once
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in gil)
    for (_a0, a1), (b0, _b1) in zip(spans, spans[1:]):
        assert b0 >= a1 - EPS_US
    assert "exported" in trace["otherData"]["gil_holds"]


def test_one_slice_per_manager_call_on_its_thread_s_track(sim_run):
    results, _, trace = sim_run
    tracks = track_names(trace, "threads")
    calls = slices(trace, pid=1, cat="call")
    assert len(calls) == len(results["calls"])
    by_index = {e["args"]["index"]: e for e in calls}
    for c in results["calls"]:
        e = by_index[c["index"]]
        assert e["name"] == c["api"]
        assert tracks[e["tid"]] == c["thread"]
        assert e["args"]["phase"] == c["phase"] and e["args"]["ok"] == c["ok"]
    assert {e["name"] for e in calls} == {"KVCacheManager.probe_reuse", "KvCache.resize"}


def lock_slices_inside_calls(results: dict, trace: dict) -> list[dict]:
    """Asserts every lock wait and hold lies inside its call, on that thread's lock track;
    returns the holds."""
    tracks = track_names(trace, "threads")
    calls = {e["args"]["index"]: e for e in slices(trace, cat="call")}
    locks = slices(trace, pid=1, cat="lock")
    holds = [e for e in locks if e["name"].startswith("lock hold")]
    waits = [e for e in locks if e["name"].startswith("lock wait")]
    assert len(holds) == sum(c["lock_granted_ms"] is not None for c in results["calls"]) > 0
    assert len(waits) == sum((c["lock_wait_ms"] or 0) > 0 for c in results["calls"])
    for e in locks:
        call = calls[e["args"]["index"]]
        assert tracks[e["tid"]] == f"{tracks[call['tid']]} / lock"
        assert e["args"]["api"] == call["name"]
        assert call["ts"] - EPS_US <= e["ts"]
        assert e["ts"] + e["dur"] <= call["ts"] + call["dur"] + EPS_US
    return holds


def no_overlaps(trace: dict) -> None:
    """Asserts slices on one track never overlap (Perfetto needs them nested; none nest here)."""
    per_track = defaultdict(list)
    for e in slices(trace):
        per_track[e["pid"], e["tid"]].append(e)
    for events in per_track.values():
        events.sort(key=lambda e: e["ts"])
        for a, b in zip(events, events[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + EPS_US, (a, b)


def test_lock_waits_and_holds_lie_inside_their_calls(sim_run):
    results, _, trace = sim_run
    holds = lock_slices_inside_calls(results, trace)
    assert any(e["name"].startswith("lock wait") for e in slices(trace, cat="lock"))
    resize = next(e for e in holds if e["args"]["api"] == "KvCache.resize")
    assert resize["name"] == "lock hold (exclusive)"


def test_slices_on_one_track_never_overlap(sim_run):
    no_overlaps(sim_run[2])


def test_copy_batches_sit_on_their_direction_s_tracks_and_add_up_to_the_link_bytes(sim_run):
    results, _, trace = sim_run
    tracks = track_names(trace, "copies")
    copies = slices(trace, pid=2)
    assert len(copies) == len(results["copies"]) > 0
    moved = defaultdict(int)
    for e in copies:
        direction, stream = tracks[e["tid"]].split(" / ")
        moved[direction] += e["args"]["bytes"]
        assert e["cat"] == "copy" and e["name"].endswith(direction)
        assert {"bytes", "pages", "path", "ctas"} <= set(e["args"])
    assert results["link"]["bytes"]["offload"] > 0
    for direction, num_bytes in results["link"]["bytes"].items():
        assert moved[direction] == num_bytes
    (batch,) = results["copies"]
    (e,) = copies
    assert e["args"]["pages"] == batch["pages"] and e["args"]["path"] == batch["path"]
    assert e["ts"] == pytest.approx(batch["started"] * 1e6, abs=EPS_US)
    assert e["dur"] == pytest.approx(batch["seconds"] * 1e6, abs=EPS_US)
    assert tracks[e["tid"]] == f"offload / {batch['stream']}"


def test_copy_batches_overlapping_on_one_stream_go_to_a_second_lane(sim_run):
    results, _, _ = sim_run
    (batch,) = results["copies"]
    later = batch | {"started": batch["started"] + batch["seconds"] / 2,
                     "finished": batch["finished"] + batch["seconds"] / 2}
    trace = trace_events(results | {"copies": [batch, later]})
    stream = batch["stream"]
    assert list(track_names(trace, "copies").values()) == [
        f"offload / {stream}", f"offload / {stream} (2)"]
    assert len({e["tid"] for e in slices(trace, pid=2)}) == 2
    no_overlaps(trace)


def test_every_variant_directory_gets_its_own_trace(sim_run):
    results, out, trace = sim_run
    assert trace["otherData"]["variant"] is None
    for name, v_results in results["_variant_results"].items():
        v_trace = read(out / "variants" / name / "trace.json")
        assert v_trace["otherData"]["variant"] == name
        assert len(slices(v_trace, cat="call")) == len(v_results["calls"])


def test_same_results_give_byte_identical_traces(sim_run, tmp_path):
    _, out, _ = sim_run
    run_into(tmp_path / "again")
    for rel in ("trace.json", "variants/writer_preference/trace.json"):
        assert (tmp_path / "again" / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_the_cap_keeps_the_earliest_slices_and_says_how_many_it_left_out(sim_run, tmp_path):
    results, _, full = sim_run
    total = len(slices(full))
    assert full["otherData"]["slices_left_out"] == 0
    assert full["otherData"]["slices_total"] == total
    write_trace(results, tmp_path / "trace.json", max_events=10)
    capped = read(tmp_path / "trace.json")
    kept = slices(capped)
    assert len(kept) == 10
    other = capped["otherData"]
    assert (other["max_events"], other["slices_written"], other["slices_left_out"]) == (
        10, 10, total - 10)
    assert max(e["ts"] for e in kept) <= other["cut_at_us"]
    earliest = sorted(e["ts"] for e in slices(full))[:10]
    assert sorted(e["ts"] for e in kept) == earliest
    # the tracks are all still named
    assert track_names(capped, "threads") == track_names(full, "threads")
    assert track_names(capped, "copies") == track_names(full, "copies")


def test_calls_cut_off_by_a_deadlock_run_to_the_end_of_the_run():
    sf = load_scenario_file(GIL_DEADLOCK)
    buggy = next(s for v, s in sf.variants if v.name == "buggy")
    results = execute(buggy)
    stuck = [c for c in results["calls"] if c["latency_ms"] is None]
    assert stuck
    trace = trace_events(results)
    end_us = results["sim"]["end_time_s"] * 1e6
    by_index = {e["args"]["index"]: e for e in slices(trace, cat="call")}
    for c in stuck:
        e = by_index[c["index"]]
        assert e["args"]["unfinished"] is True
        assert e["ts"] + e["dur"] == pytest.approx(end_us, abs=EPS_US)
    assert any(e["args"].get("unfinished") for e in slices(trace, cat="lock"))


def test_the_plan_executor_writes_no_trace(tmp_path):
    run_into(tmp_path / "plan", overrides=SMALL + ["executor=plan"])
    assert not list((tmp_path / "plan").rglob("trace.json"))
    assert (tmp_path / "plan" / "results.json").is_file()


def test_a_hw_run_without_a_gpu_has_the_sim_run_s_track_structure(sim_run, tmp_path):
    _, _, sim_trace = sim_run
    hw_results = run_into(tmp_path / "hw", overrides=SMALL + ["executor=hw", "hw.copier=none"])
    assert hw_results["executor"] == "hw"
    hw_trace = read(tmp_path / "hw" / "trace.json")
    assert hw_trace["otherData"]["executor"] == "hw"
    assert hw_trace["otherData"]["end_time_us"] == pytest.approx(
        hw_results["hw"]["end_time_s"] * 1e6, abs=EPS_US)
    assert process_names(hw_trace) == process_names(sim_trace)
    assert track_names(hw_trace, "threads") == track_names(sim_trace, "threads")
    def directions(trace: dict) -> set[str]:
        return {name.split(" / ")[0] for name in track_names(trace, "copies").values()}

    assert directions(hw_trace) == directions(sim_trace) == {"offload"}
    assert len(slices(hw_trace, cat="call")) == len(hw_results["calls"])
    lock_slices_inside_calls(hw_results, hw_trace)
    no_overlaps(hw_trace)
    assert sum(e["args"]["bytes"] for e in slices(hw_trace, pid=2)) == (
        hw_results["link"]["bytes"]["offload"])
    assert (tmp_path / "hw" / "variants" / "writer_preference" / "trace.json").is_file()
