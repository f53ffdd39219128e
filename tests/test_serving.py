"""The serving layer: engine times, GPU work with copies, the disk level, the engine's loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simpy

from kvsim.errors import ConfigError
from kvsim.hardware.disk import DiskSpec, load_disk
from kvsim.llm.architectures import LLAMA_3_8B, MISTRAL_7B
from kvsim.llm.engine_time import attended_pairs, load_engine_times
from kvsim.manager.plan import CopyBatch
from kvsim.scenario.load import load_scenario_file
from kvsim.scenario.run import execute
from kvsim.scenario.source import ScenarioError

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "scenarios" / "traces" / "mooncake_sample.jsonl"
TOY = Path(__file__).parent / "data" / "toy-hardware.json"

# Round terms (ms) so that pass times can be computed by hand.
TERMS = {"prefill_per_layer_ms": {"floor": 0.5, "a": 0.1, "b_per_token": 0.001, "d_per_pair": 1e-7,
                                  "e_per_cached": 1e-5},
         "decode_per_layer_ms": {"floor": 0.05, "a": 0.1, "b_per_sequence": 0.001,
                                 "e_per_context_token": 1e-6},
         "head_ms": {"h0": 0.2, "h1_per_token": 0.01}}


def engine_file(tmp_path: Path, archs=("llama-3-8b",)) -> Path:
    doc = {"schema": "kvsim-engine-times/1", "gpu": "test", "source": "test fixture",
           "architectures": {a: TERMS for a in archs}}
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("new,cached,window", [(1, 0, None), (7, 5, None), (100, 0, 64),
                                               (100, 30, 64), (10, 200, 64), (64, 0, 64)])
def test_attended_pairs_counts_each_new_tokens_keys(new, cached, window):
    from kvsim.calibration.prefill_fit import pairs

    assert attended_pairs(new, cached, window) == int(pairs(new, cached, window))


def test_prefill_and_decode_times_follow_their_terms(tmp_path):
    times = load_engine_times(str(engine_file(tmp_path)), LLAMA_3_8B)
    # 1000 new after 0 cached: 0.1 + 1.0 + 1e-7 * 500500 = 1.15005 ms/layer, x 32, + head(1)
    assert times.prefill_seconds(1000, 0) == pytest.approx((32 * 1.15005 + 0.21) * 1e-3)
    assert times.prefill_seconds(10, 0) == pytest.approx((32 * 0.5 + 0.21) * 1e-3)  # the floor
    assert times.prefill_seconds(0, 500) == 0.0
    # decode of two sequences of 1000 and 3000 tokens: 0.1 + 0.002 + 0.004 per layer, head(2)
    assert times.decode_seconds([1000, 3000]) == pytest.approx((32 * 0.106 + 0.22) * 1e-3)
    assert times.decode_seconds([]) == 0.0


def test_a_sliding_window_caps_what_decode_reads(tmp_path):
    times = load_engine_times(str(engine_file(tmp_path, ("mistral-7b-v0.1",))), MISTRAL_7B)
    assert times.decode_seconds([100_000]) == times.decode_seconds([MISTRAL_7B.sliding_window])


def test_engine_times_errors_name_what_is_missing(tmp_path):
    path = engine_file(tmp_path)
    with pytest.raises(ConfigError, match="no terms for architecture 'mistral-7b-v0.1'"):
        load_engine_times(str(path), MISTRAL_7B)
    doc = json.loads(path.read_text())
    del doc["architectures"]["llama-3-8b"]["decode_per_layer_ms"]["floor"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="decode_per_layer_ms lacks floor"):
        load_engine_times(str(path), LLAMA_3_8B)
    with pytest.raises(ConfigError, match="no file"):
        load_engine_times("no-such-gpu", LLAMA_3_8B)


# -- GPU work and its copies, in the simulator ------------------------------------------------------
def run_gpu_work(layers: int, compute_s: float, copy_bytes: int):
    """One thread submits a host-to-GPU batch of ``copy_bytes`` through a call, then a pass."""
    from kvsim.hardware import load_hardware
    from kvsim.manager import KVCacheManager, LayerConfig, LevelConfig, ManagerConfig, Outcome, Plan
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.runtime.apis import Api
    from kvsim.runtime.steps import Call, GpuWork
    from kvsim.sim.executor import SimExecutor, SimOptions

    config = ManagerConfig((LayerConfig((1 << 20,)),), (LevelConfig("gpu", 64 << 20),
                                                          LevelConfig("host", 64 << 20)))
    manager = KVCacheManager(config)
    pages = copy_bytes >> 20
    import numpy as np

    def invoke() -> Outcome:
        plan = Plan("KVCacheManager.probe_reuse")
        plan.copies.append(CopyBatch(1, 0, 0, np.arange(pages), np.arange(pages), (1 << 20,)))
        return Outcome(0, plan)

    times = {}

    def thread():
        yield Call("t", Api.PROBE_REUSE, {}, invoke)
        times["t"] = yield GpuWork(compute_s, layers)

    ex = SimExecutor(manager, load_hardware(TOY), load_cpu_model("kvcm2-cpp"),
                     SimOptions(copy_path="ce-batch"))
    ex.run({"t": thread()})
    return times["t"], ex.stream.records[0]


def test_gpu_work_waits_for_the_threads_copies_then_computes():
    t, copy = run_gpu_work(0, 0.010, 64 << 20)
    assert t.copies_landed == pytest.approx(copy.finished)
    assert t.end == pytest.approx(copy.finished + 0.010)


def test_gpu_work_overlapped_layer_by_layer_ends_by_the_formula():
    t, copy = run_gpu_work(4, 0.010, 64 << 20)
    landed = copy.finished
    want = max(landed + 0.010 / 4, t.start + (landed - t.start) / 4 + 0.010)
    assert t.end == pytest.approx(want)
    serial, _ = run_gpu_work(0, 0.010, 64 << 20)
    assert t.end < serial.end


# -- the disk level ---------------------------------------------------------------------------------
def disk_copy_time(src: int, dst: int, nbytes: int, disk: DiskSpec) -> float:
    import numpy as np

    from kvsim.hardware import load_hardware
    from kvsim.sim.link import Link
    from kvsim.sim.stream import CopyStream

    toy = load_hardware(TOY)
    env = simpy.Environment()
    stream = CopyStream(env, "s", Link.of_hardware(env, toy), toy,
                        {"offload": "ce-batch", "onboard": "ce-batch"}, None, None, True, disk)
    pages = nbytes >> 20
    done = stream.submit(CopyBatch(src, dst, 0, np.arange(pages), np.arange(pages), (1 << 20,)),
                         "t", "api")
    env.run(done)
    return env.now


def test_a_disk_read_to_the_gpu_takes_latency_plus_bytes_at_the_disks_rate():
    disk = DiskSpec("d", read_gbps=10.0, write_gbps=5.0, read_latency_us=100.0,
                    write_latency_us=20.0, drives=2)
    nbytes = 1 << 30
    # 2 drives x 10 GB/s = 20 GB/s, under the toy link's 100 GB/s
    assert disk_copy_time(2, 0, nbytes, disk) == pytest.approx(100e-6 + nbytes / 20e9)
    assert disk_copy_time(1, 2, nbytes, disk) == pytest.approx(20e-6 + nbytes / 10e9)


def test_shipped_disks_load_with_sources_and_bad_ones_are_refused(tmp_path):
    for name in ("micron-7450-gen4", "micron-9550-gen5"):
        disk = load_disk(name, 8)
        assert disk.per_direction_gbps["onboard"] == pytest.approx(8 * disk.read_gbps)
        doc = json.loads((ROOT / "kvsim" / "hardware" / "disks" / f"{name}.json").read_text())
        assert set(doc["sources"]) == {"read_gbps", "write_gbps", "read_latency_us",
                                       "write_latency_us"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"read_gbps": 0, "write_gbps": 1, "read_latency_us": 1,
                               "write_latency_us": -1}))
    with pytest.raises(ConfigError, match="read_gbps, write_latency_us"):
        load_disk(str(bad))
    with pytest.raises(ConfigError, match="unknown disk"):
        load_disk("floppy")


# -- the engine --------------------------------------------------------------------------------------
SCENARIO = """\
name: serving_test
executor: sim
hardware: h200-sxm
cpu_model: kvcm2-cpp
{sim}
expect_failures: [KvCache.resume, KvCache.resize]
manager:
  tokens_per_block: 32
  layers:
    - slot_bytes: [{half}, {half}]
  levels:
{levels}
workload:
  kind: serving
  trace: {trace}
  architecture: llama-3-8b
  engine_times: {engine}
  {extra}
"""
HALF = LLAMA_3_8B.kv_bytes_per_token * 32 // 2


def serving(tmp_path, levels="    - {name: gpu, quota_bytes: 2 GiB}\n"
            "    - {name: host, quota_bytes: 4 GiB}", half=HALF, sim="", extra="", name="s.yaml"):
    path = tmp_path / name
    path.write_text(SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), levels=levels,
                                    half=half, sim=sim, extra=extra))
    return load_scenario_file(path)


def test_every_request_gets_its_first_token_after_its_prefill(tmp_path):
    sf = serving(tmp_path)
    results = execute(sf.base)
    s = results["workload_summary"]
    assert s["requests"] == 16 and s["finished"] == 16 and s["failed"] == 0
    assert not results["violations"]
    times = load_engine_times(str(engine_file(tmp_path)), LLAMA_3_8B)
    for row in s["per_request"]:
        prefill_ms = times.prefill_seconds(row["new_tokens"], row["cached_tokens"]) * 1e3
        assert row["ttft_ms"] >= prefill_ms + row["queue_ms"] - 1e-6
        assert row["new_tokens"] + row["cached_tokens"] == row["input_tokens"]
    # the sample's requests share prefixes: some are reused, the rest recomputed
    assert 0 < s["reused_tokens"] < s["reused_tokens"] + s["recomputed_tokens"]
    assert s["gpu_busy_s"] == pytest.approx(s["prefill_s"] + s["decode_s"])


def test_a_small_gpu_tier_onboards_from_the_host_and_a_full_one_queues(tmp_path):
    small = execute(serving(tmp_path, levels="    - {name: gpu, quota_bytes: 400 MiB}\n"
                            "    - {name: host, quota_bytes: 4 GiB}").base)["workload_summary"]
    assert small["onboarded_pages"]["host"] > 0
    assert small["moved_bytes"]["host->gpu"] > 0 and small["moved_bytes"]["gpu->host"] > 0
    assert small["admission_retries"] > 0  # requests waited for GPU room


def test_serving_results_are_deterministic(tmp_path):
    from kvsim.scenario.results import public

    a = public(execute(serving(tmp_path).base))
    b = public(execute(serving(tmp_path, name="t.yaml").base))
    a.pop("scenario_file", None), b.pop("scenario_file", None)
    assert json.dumps(a["workload_summary"], sort_keys=True) == \
        json.dumps(b["workload_summary"], sort_keys=True)


def test_a_disk_tier_is_simulated_in_time(tmp_path):
    levels = ("    - {name: gpu, quota_bytes: 400 MiB}\n    - {name: host, quota_bytes: 400 MiB}\n"
              "    - {name: disk, quota_bytes: 8 GiB}")
    results = execute(serving(tmp_path, levels=levels, sim="sim: {disk: micron-7450-gen4}").base)
    disk = [c for c in results["copies"] if c["path"] == "disk"]
    assert disk and all(c["seconds"] >= 15e-6 for c in disk)  # at least the write latency
    assert results["disk"]["name"] == "micron-7450-gen4"


def test_a_layout_that_is_not_the_architectures_is_refused_naming_the_field(tmp_path):
    with pytest.raises(ScenarioError, match=r"manager\.layers.*llama-3-8b.*bytes per block"):
        serving(tmp_path, half=8192)


def test_an_unknown_disk_or_a_disk_without_a_disk_level_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match=r"sim\.disk.*unknown disk 'floppy'"):
        serving(tmp_path, sim="sim: {disk: floppy}")
    with pytest.raises(ScenarioError, match=r"sim\.disk.*2 levels"):
        serving(tmp_path, sim="sim: {disk: micron-7450-gen4}")


def test_an_unknown_architecture_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), half=HALF, sim="",
                                    extra="", levels="    - {name: gpu, quota_bytes: 2 GiB}")
                    .replace("llama-3-8b", "gpt-5"))
    with pytest.raises(ScenarioError, match=r"workload\.architecture"):
        load_scenario_file(path)


def test_the_hardware_executor_runs_the_engine_on_real_threads(tmp_path):
    """hw executor, no copier, passes slept (hw.forward model): the same engine, a real clock."""
    sf = serving(tmp_path, extra="max_requests: 3\n  time_scale: 0.01")
    from dataclasses import replace

    hw_sc = replace(sf.base, executor="hw", hw=replace(sf.base.hw, copier="none"))
    results = execute(hw_sc)
    s = results["workload_summary"]
    assert s["requests"] == 3 and s["finished"] == 3
    times = load_engine_times(str(engine_file(tmp_path)), LLAMA_3_8B)
    for row in s["per_request"]:
        prefill_ms = times.prefill_seconds(row["new_tokens"], row["cached_tokens"]) * 1e3
        assert row["ttft_ms"] >= prefill_ms - 1e-5  # rows keep 1 ns


def test_a_slice_of_the_trace_counts_arrivals_from_its_first_request(tmp_path):
    from kvsim.serving.engine import load_requests

    sf = serving(tmp_path, extra="first_request: 4\n  max_requests: 3\n  layers: 8",
                 half=HALF // 4)
    reqs = load_requests(sf.base.workload)
    assert [r.index for r in reqs] == [4, 5, 6] and reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(0.25)  # the sample's requests are 250 ms apart
    s = execute(sf.base)["workload_summary"]
    assert [r["request"] for r in s["per_request"]] == [4, 5, 6]


# -- kvsim tiers -------------------------------------------------------------------------------------
def test_parse_tokens_allows_zero_and_suffixes():
    import argparse

    from kvsim.cli.tiers import parse_tokens

    assert parse_tokens("0,10k,2M") == [0, 10_000, 2_000_000]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_tokens("0,lots")


def test_kvsim_tiers_sweeps_host_and_disk_and_reports(tmp_path):
    from kvsim.cli import main

    sf_path = tmp_path / "s.yaml"
    sf_path.write_text(SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), half=HALF,
                                       sim="", extra="", levels="    - {name: gpu, quota_bytes: 1 GiB}"))
    out = tmp_path / "tiers"
    assert main(["tiers", str(sf_path), "--host-tokens", "0,10k", "--disk-tokens", "0,50k",
                 "--disk", "micron-7450-gen4", "--workers", "1", "--out", str(out), "--quiet"]) == 0
    import pandas as pd

    table = pd.read_csv(out / "results.csv")
    assert len(table) == 3 and set(table["status"]) == {"ok"}  # host 0, host 10k, 10k + 50k disk
    assert sorted(table["cfg_host_tier_bytes"] // LLAMA_3_8B.kv_bytes_per_token) == [0, 10_000, 10_000]
    disk = table[table["cfg_disk_tier_bytes"] > 0]
    assert list(disk["cfg_disk"]) == ["micron-7450-gen4 x1"]
    report = (out / "report.md").read_text()
    assert "**Recommendation.**" in report and "break-even" in report.lower()
    assert (out / "tiers.png").stat().st_size > 0
    # the host tier raises the hit rate over the GPU tier alone
    by_host = dict(zip(table["cfg_host_tier_bytes"], table["serving_hit_rate"]))
    assert by_host[10_000 * LLAMA_3_8B.kv_bytes_per_token] > by_host[0]


def test_kvsim_tiers_refuses_a_disk_without_a_drive_or_a_host_tier(tmp_path, capsys):
    from kvsim.cli import main

    sf_path = tmp_path / "s.yaml"
    sf_path.write_text(SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), half=HALF,
                                       sim="", extra="", levels="    - {name: gpu, quota_bytes: 1 GiB}"))
    assert main(["tiers", str(sf_path), "--disk-tokens", "50k", "--out", str(tmp_path / "a")]) == 2
    assert "needs --disk" in capsys.readouterr().err
    assert main(["tiers", str(sf_path), "--host-tokens", "0", "--disk-tokens", "50k", "--disk",
                 "micron-7450-gen4", "--out", str(tmp_path / "b")]) == 2
    assert "needs a host tier" in capsys.readouterr().err


def test_the_plan_executor_runs_the_engine_at_nominal_times(tmp_path):
    """No clock: Now is the thread's nominal time, a pass lasts its modelled seconds."""
    from dataclasses import replace

    sf = serving(tmp_path, extra="max_requests: 4")
    plan = execute(replace(sf.base, executor="plan"))["workload_summary"]
    sim = execute(sf.base)["workload_summary"]
    assert plan["finished"] == sim["finished"] == 4
    assert plan["reused_tokens"] == sim["reused_tokens"]
    times = load_engine_times(str(engine_file(tmp_path)), LLAMA_3_8B)
    for row in plan["per_request"]:
        assert row["copy_wait_ms"] == 0.0  # copies land at once without a clock
        prefill_ms = times.prefill_seconds(row["new_tokens"], row["cached_tokens"]) * 1e3
        assert row["ttft_ms"] >= prefill_ms - 1e-5  # rows keep 1 ns


def test_kvsim_run_reports_ttft_for_a_serving_scenario(tmp_path):
    from kvsim.cli import main

    sf_path = tmp_path / "s.yaml"
    sf_path.write_text(SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), half=HALF,
                                       sim="", extra="max_requests: 5",
                                       levels="    - {name: gpu, quota_bytes: 2 GiB}"))
    out = tmp_path / "run"
    assert main(["run", str(sf_path), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert report.startswith("# serving_test") and "## Serving" in report
    assert "5 of 5 requests got their first token: TTFT p50" in report
    assert (out / "ttft.png").stat().st_size > 0


@pytest.mark.parametrize("extra,field,message", [
    ("first_request: 99", r"workload\.first_request", "the trace has 16 requests"),
    ("engine_times: nowhere.json", r"workload\.engine_times", "no file"),
])
def test_bad_serving_fields_are_refused_before_the_run(tmp_path, extra, field, message):
    path = tmp_path / "s.yaml"
    text = SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), half=HALF, sim="",
                           extra=extra, levels="    - {name: gpu, quota_bytes: 2 GiB}")
    if extra.startswith("engine_times"):
        text = text.replace(f"  engine_times: {engine_file(tmp_path)}\n", "")
    path.write_text(text)
    with pytest.raises(ScenarioError, match=f"{field}.*{message}"):
        load_scenario_file(path)


def test_a_torch_forward_for_another_workload_is_refused(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("name: b\nexecutor: hw\nhardware: h200-sxm\nhw: {copier: none, forward: torch}\n"
                    "manager:\n  layers: [{slot_bytes: [8 KiB]}]\n  levels: [{name: gpu, "
                    "quota_bytes: 1 MiB}]\nworkload: {kind: burst_resize, history_tokens: 64}\n")
    with pytest.raises(ScenarioError, match=r"hw\.forward.*burst_resize"):
        load_scenario_file(path)


def test_kvsim_tiers_refuses_a_scenario_that_is_not_serving(capsys):
    from kvsim.cli import main

    assert main(["tiers", str(ROOT / "scenarios" / "seed" / "burst_resize.yaml"),
                 "--host-tokens", "0,1M"]) == 2
    assert "needs a serving workload" in capsys.readouterr().err


def test_overlapping_onboarding_with_prefill_shortens_ttft_and_copy_waits(tmp_path):
    levels = "    - {name: gpu, quota_bytes: 400 MiB}\n    - {name: host, quota_bytes: 4 GiB}"
    serial = execute(serving(tmp_path, levels=levels).base)["workload_summary"]
    overlap = execute(serving(tmp_path, levels=levels, extra="overlap_onboarding: true",
                              name="o.yaml").base)["workload_summary"]
    assert overlap["onboarded_pages"]["host"] > 0
    assert overlap["ttft_mean_ms"] < serial["ttft_mean_ms"]
    assert overlap["copy_wait_s"] < serial["copy_wait_s"]  # the passes wait less for copies


def test_a_cold_shape_term_is_added_once_per_new_prefill_shape(tmp_path):
    path = engine_file(tmp_path)
    doc = json.loads(path.read_text())
    doc["architectures"]["llama-3-8b"]["cold_shape_ms"] = 50.0
    cold_path = tmp_path / "cold.json"
    cold_path.write_text(json.dumps(doc))
    times = load_engine_times(str(cold_path), LLAMA_3_8B)
    assert times.prefill_seconds(1000, 0, cold=True) == pytest.approx(
        times.prefill_seconds(1000, 0) + 0.050)
    assert load_engine_times(str(path), LLAMA_3_8B).cold_shape_ms == 0.0  # absent: none
    doc["architectures"]["llama-3-8b"]["cold_shape_ms"] = -1
    cold_path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="cold_shape_ms must be a number >= 0"):
        load_engine_times(str(cold_path), LLAMA_3_8B)


def test_the_ttft_judge_compares_like_with_like_and_marks_a_what_if(tmp_path):
    """The judge on a simulated 'measurement': a prediction equal to it meets every target; a
    prediction changed by an override is labelled a what-if and differs."""
    from kvsim.calibration.ttft_judge import judge, markdown
    from kvsim.report.results_dir import write_results
    from kvsim.scenario.run import run_scenario

    sf_path = tmp_path / "s.yaml"
    sf_path.write_text(SCENARIO.format(trace=TRACE, engine=engine_file(tmp_path), half=HALF,
                                       sim="", extra="max_requests: 8",
                                       levels="    - {name: gpu, quota_bytes: 2 GiB}"))
    write_results(run_scenario(load_scenario_file(sf_path)), tmp_path / "measured")
    same = judge(str(sf_path), tmp_path / "measured")
    assert same["met"] == same["judged"] == 2
    doc = json.loads(engine_file(tmp_path).read_text())
    doc["architectures"]["llama-3-8b"]["cold_shape_ms"] = 500.0  # every new shape +0.5 s
    (tmp_path / "cold.json").write_text(json.dumps(doc))
    slower = judge(str(sf_path), tmp_path / "measured",
                   [f"workload.engine_times={tmp_path / 'cold.json'}"])
    assert slower["met"] == 0 and "what-if" in markdown(slower)
    assert all(v["predicted"] > v["measured"] for v in slower["runs"]["base"]["judged"].values())


# Call 4 of the TTFT validation: an engine that pads its prefills to buckets and pins its kernel.
BUCKETS = {"min": 64, "multiple": 64, "steps_per_doubling": 8, "max": 262144}


def test_bucket_list_is_geometric_rounded_up_and_ends_at_or_past_its_max():
    from kvsim.llm.engine_time import bucket_list

    b = bucket_list(**{"min_tokens": 64, "multiple": 64, "steps_per_doubling": 8,
                       "max_tokens": 262144})
    assert b[:9] == (64, 128, 192, 256, 320, 384, 448, 512, 576)  # 64 x 2^(k/8), up to 64s
    assert list(b) == sorted(set(b)) and all(v % 64 == 0 for v in b)
    assert b[-1] == 262144 and b[-2] < 262144
    for j in range(6, 19):  # every power of two from 64 is a bucket (the call-4 grid's counts)
        assert 2 ** j in b
    steps = [hi / lo for lo, hi in zip(b, b[1:]) if lo >= 1024]
    assert max(steps) < 2 ** (1 / 8) * 1.06  # a pad is at most ~9 % past 1024 tokens
    assert bucket_list(100, 64, 1, 300) == (128, 256, 448)  # 100, 200, 400 rounded up
    with pytest.raises(ValueError, match=">= 1"):
        bucket_list(64, 0, 8, 1000)


def _bucketed(tmp_path, rule=BUCKETS, attention="flash") -> Path:
    doc = json.loads(engine_file(tmp_path).read_text())
    doc["prefill_buckets"] = rule
    doc["prefill_attention"] = attention
    path = tmp_path / "bucketed.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_bucketed_engine_prices_a_prefill_at_its_padded_count(tmp_path):
    plain = load_engine_times(str(engine_file(tmp_path)), LLAMA_3_8B)
    padded = load_engine_times(str(_bucketed(tmp_path)), LLAMA_3_8B)
    assert plain.prefill_buckets == () and plain.prefill_attention == "default"
    assert padded.prefill_attention == "flash"
    assert [padded.padded_new(n) for n in (1, 64, 65, 600, 1024, 1025, 262144)] == \
        [64, 64, 128, 640, 1024, 1152, 262144]
    assert padded.padded_new(0) == 0 and padded.padded_new(300000) == 300000  # past the last
    assert plain.padded_new(1025) == 1025
    for new, cached in ((1025, 0), (300, 4096), (70000, 5000)):
        assert padded.prefill_seconds(new, cached) == pytest.approx(
            plain.prefill_seconds(padded.padded_new(new), cached))
        assert padded.prefill_seconds(new, cached) > plain.prefill_seconds(new, cached)
    assert padded.decode_seconds([1000, 3000]) == plain.decode_seconds([1000, 3000])


@pytest.mark.parametrize("rule,attention,message", [
    ({"min": 64, "multiple": 64, "steps_per_doubling": 8}, "flash", "prefill_buckets must be"),
    ({**BUCKETS, "max": 1.5}, "flash", "prefill_buckets must be"),
    ({**BUCKETS, "multiple": 0}, "flash", ">= 1"),
    (BUCKETS, "cudnn", "prefill_attention must be one of default, flash"),
])
def test_bad_bucket_rules_and_kernels_are_refused(tmp_path, rule, attention, message):
    with pytest.raises(ConfigError, match=message):
        load_engine_times(str(_bucketed(tmp_path, rule, attention)), LLAMA_3_8B)


def test_a_serving_run_with_buckets_spends_the_padded_prefill_time(tmp_path):
    plain = execute(serving(tmp_path).base)["workload_summary"]
    path = tmp_path / "b.yaml"
    path.write_text(SCENARIO.format(trace=TRACE, engine=_bucketed(tmp_path), half=HALF, sim="",
                                    extra="", levels="    - {name: gpu, quota_bytes: 2 GiB}\n"
                                    "    - {name: host, quota_bytes: 4 GiB}"))
    padded = execute(load_scenario_file(path).base)["workload_summary"]
    assert padded["requests"] == plain["requests"]
    assert padded["prefill_s"] > plain["prefill_s"]
    assert padded["ttft_mean_ms"] > plain["ttft_mean_ms"]


def test_pass_bands_divide_each_pass_by_its_price_and_band_it_by_new_tokens(tmp_path):
    from kvsim.calibration.ttft_judge import pass_bands

    times = load_engine_times(str(engine_file(tmp_path)), LLAMA_3_8B)
    price = [times.prefill_seconds(n, c) * 1e3 for n, c in ((500, 0), (300, 200), (20000, 0))]
    forward = {"per_pass": {"prefills": [[[500, 0]], [[300, 200], [0, 900]], [[20000, 0]]],
                            "prefill_ms": [2 * price[0], 4 * price[1], price[2]]}}
    rows = pass_bands(forward, times)
    assert [(r["new_tokens"], r["passes"]) for r in rows] == [("< 1k", 2), (">= 16k", 1)]
    assert rows[0]["median"] == pytest.approx(3.0) and rows[0]["max"] == pytest.approx(4.0)
    assert rows[1]["median"] == pytest.approx(1.0)
    assert pass_bands({}, times) == []


def test_a_new_squared_prefill_term_is_added_where_the_file_has_it(tmp_path):
    base = load_engine_times(str(engine_file(tmp_path, ("mistral-7b-v0.1",))), MISTRAL_7B)
    doc = json.loads((tmp_path / "engine.json").read_text())
    doc["architectures"]["mistral-7b-v0.1"] = {**TERMS, "prefill_per_layer_ms": {
        **TERMS["prefill_per_layer_ms"], "g_per_new_sq": 1e-9}}
    (tmp_path / "engine.json").write_text(json.dumps(doc))
    times = load_engine_times(str(tmp_path / "engine.json"), MISTRAL_7B)
    # 10,000 new tokens: 1e-9 x 1e8 = 0.1 ms more per layer, x 32 layers
    assert times.prefill_seconds(10_000, 0) - base.prefill_seconds(10_000, 0) == \
        pytest.approx(32 * 0.1e-3)
    assert times.prefill_seconds(10, 0) == base.prefill_seconds(10, 0)  # the floor holds
    doc["architectures"]["mistral-7b-v0.1"]["prefill_per_layer_ms"]["g_per_new_sq"] = -1
    (tmp_path / "engine.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="g_per_new_sq"):
        load_engine_times(str(tmp_path / "engine.json"), MISTRAL_7B)
