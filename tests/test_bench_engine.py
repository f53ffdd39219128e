"""hw.bench_engine (the engine-like prefill / decode / head bench) and
kvsim.calibration.engine_fit (its model, split and engine-times file)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hw.bench_engine import (
    DECODE_KV_BUDGET_BYTES,
    GRID_BATCH,
    GRID_CONTEXT,
    GRID_HEAD_TOKENS,
    decode_kv_bytes,
    decode_kv_slots,
)
from hw.bench_prefill import GRID_CACHED, GRID_NEW
from kvsim.calibration import engine_fit
from kvsim.calibration.prefill_fit import pairs
from kvsim.llm.architectures import ARCHITECTURES


def test_decode_memory_rule_drops_only_the_largest_full_attention_points():
    over = {(name, b, c) for name, a in ARCHITECTURES.items() for b in GRID_BATCH
            for c in GRID_CONTEXT if decode_kv_bytes(a, b, c, layers=2) > DECODE_KV_BUDGET_BYTES}
    # llama-3-8b: 2 x 2 layers x 256 x 32769 slots x 8 KV heads x 128 x 2 bytes = 64 GiB
    assert over == {("llama-3-8b", 256, 32768)}


def test_decode_slots_of_a_window_stop_at_the_window():
    assert decode_kv_slots(512, None) == 513
    assert decode_kv_slots(32768, 4096) == 4096
    assert decode_kv_slots(100, 4096) == 101


def test_split_is_the_checkerboard_on_each_grid():
    grid = {"new": GRID_NEW, "cached": GRID_CACHED, "batch": GRID_BATCH,
            "context": GRID_CONTEXT, "tokens": GRID_HEAD_TOKENS}
    roles = [engine_fit.point_role({"batch": b, "context": c}, ("batch", "context"), grid)
             for b in GRID_BATCH for c in GRID_CONTEXT]
    assert roles.count("fit") == roles.count("judge") == 10
    assert engine_fit.point_role({"batch": 1, "context": 512}, ("batch", "context"), grid) == "fit"
    assert engine_fit.point_role({"batch": 4, "context": 512}, ("batch", "context"), grid) == "judge"
    assert [engine_fit.point_role({"tokens": t}, ("tokens",), grid) for t in GRID_HEAD_TOKENS] == \
        ["fit", "judge", "fit", "judge", "fit"]
    assert engine_fit.point_role({"tokens": 3}, ("tokens",), grid) == "off-grid"


def test_kv_read_counts_each_sequence_up_to_the_window():
    assert engine_fit.kv_read(4, 8192, None) == 4 * 8192
    assert engine_fit.kv_read(4, 8192, 4096) == 4 * 4096


PREFILL = {"floor": 0.3, "a": 0.05, "b_per_token": 2e-4, "d_per_pair": 4e-9, "e_per_cached": 1e-5}
DECODE = {"floor": 0.05, "a": 0.04, "b_per_sequence": 1e-3, "e_per_context_token": 3e-7}
HEAD = {"h0": 0.02, "h1_per_token": 4e-4}


def _synthetic(window: int | None = None, noise: float = 0.0) -> dict:
    """A measurement whose times follow the model exactly (times ``1 + noise`` on judge-like
    alternating points), as hw.bench_engine writes it."""
    rng = np.random.default_rng(0)
    p, d, h = PREFILL, DECODE, HEAD
    recs = []
    for c in GRID_CACHED:
        for n in GRID_NEW:
            t = max(p["floor"], p["a"] + p["b_per_token"] * n + p["d_per_pair"] * pairs(n, c, window)
                    + p["e_per_cached"] * c) * (1 + noise * rng.standard_normal())
            recs.append({"mode": "prefill", "arch": "m", "new": n, "cached": c, "per_layer_ms": t,
                         "median_ms": 2 * t, "verified": True})
    for c in GRID_CONTEXT:
        for b in GRID_BATCH:
            t = max(d["floor"], d["a"] + d["b_per_sequence"] * b
                    + d["e_per_context_token"] * engine_fit.kv_read(b, c, window))
            recs.append({"mode": "decode", "arch": "m", "batch": b, "context": c,
                         "per_layer_ms": t * (1 + noise * rng.standard_normal()),
                         "median_ms": 2 * t, "verified": True})
    for tok in GRID_HEAD_TOKENS:
        recs.append({"mode": "head", "arch": "m", "tokens": tok,
                     "median_ms": h["h0"] + h["h1_per_token"] * tok, "verified": True})
    recs.append({"mode": "decode", "arch": "m", "batch": 2, "context": 512, "per_layer_ms": 99.0,
                 "median_ms": 198.0, "verified": False})  # a failed check: left out
    return {"grid": {"new": list(GRID_NEW), "cached": list(GRID_CACHED), "batch": list(GRID_BATCH),
                     "context": list(GRID_CONTEXT), "head_tokens": list(GRID_HEAD_TOKENS)},
            "architectures": {"m": {"layers": 32, "sliding_window": window}},
            "provenance": {"date_utc": "2026-12-04T04:00:00+00:00", "gpu_name": "NVIDIA H200",
                           "torch": "2.11.0", "nvml": {"driver_version": "580.159.04"}},
            "records": recs}


@pytest.mark.parametrize("window", [None, 4096])
def test_fit_recovers_a_model_that_holds_exactly(window):
    res = engine_fit.fit(_synthetic(window))["architectures"]["m"]
    for mode in ("prefill", "decode", "head"):
        j = res[mode]["errors"]["judge"]
        assert j["points"] >= 2 and j["median_ape_pct"] < 0.5, (mode, j)
    assert res["prefill_met"] and res["decode_met"]
    assert res["decode"]["errors"]["fit"]["points"] + res["decode"]["errors"]["judge"]["points"] == 20
    assert res["head"]["terms"] == pytest.approx(HEAD, rel=1e-4)


def test_noise_over_the_target_is_judged_missed():
    res = engine_fit.fit(_synthetic(noise=0.3))["architectures"]["m"]
    assert res["prefill"]["errors"]["judge"]["median_ape_pct"] > engine_fit.TARGET_MEDIAN_APE_PCT
    assert not res["prefill_met"]


def test_engine_file_has_the_simulators_shape_and_is_byte_deterministic(tmp_path):
    m = tmp_path / "m.json"
    m.write_text(json.dumps(_synthetic()))
    outs = []
    e = tmp_path / "e.json"
    for _ in range(2):
        assert engine_fit.main([str(m), "--engine", str(e)]) == 0
        outs.append(e.read_bytes())
    assert outs[0] == outs[1] and outs[0].endswith(b"}\n")
    doc = json.loads(outs[0])
    assert set(doc) == {"schema", "gpu", "source", "fit", "architectures"}
    assert doc["schema"] == "kvsim-engine-times/1" and doc["gpu"] == "h200-sxm"
    assert doc["source"] == f"{m} (2026-12-04T04:00:00+00:00, NVIDIA H200, driver 580.159.04, torch 2.11.0)"
    assert doc["fit"].startswith("python -m kvsim.calibration.engine_fit ")
    a = doc["architectures"]["m"]
    assert set(a) == {"prefill_per_layer_ms", "decode_per_layer_ms", "head_ms", "held_out"}
    assert set(a["prefill_per_layer_ms"]) == set(PREFILL)
    assert set(a["decode_per_layer_ms"]) == set(DECODE)
    assert set(a["head_ms"]) == set(HEAD)
    assert set(a["held_out"]) == {"prefill_median_ape_pct", "decode_median_ape_pct",
                                  "prefill_met", "decode_met"}


def test_engine_file_refuses_an_architecture_without_every_mode():
    meas = _synthetic()
    meas["records"] = [r for r in meas["records"] if r["mode"] != "head"]
    with pytest.raises(ValueError, match="no head fit"):
        engine_fit.engine_doc(engine_fit.fit(meas), "h200-sxm", "s", "c")


def _run_tiny(tmp_path, device: str, *extra: str) -> dict:
    from hw.bench_engine import main

    assert main(["--out", str(tmp_path), "--tiny", "--device", device, "--samples", "2",
                 "--warmup", "1", *extra]) == 0
    (path,) = tmp_path.glob("*-engine.json")
    return json.loads(path.read_text())


def _assert_complete(doc: dict) -> None:
    recs = doc["records"]
    assert recs and all(r["verified"] for r in recs) and not doc["problems"]
    for name in ARCHITECTURES:
        n = {m: sum(r["arch"] == name and r["mode"] == m for r in recs)
             for m in ("prefill", "decode", "head")}
        assert n == {"prefill": 9, "decode": 9, "head": 3}, (name, n)
        assert doc["attention_check"][name]["ok"], doc["attention_check"][name]
        assert set(doc["backend"][name]) == {"prefill", "prefill_uncached", "decode"}
    prefill = [r for r in recs if r["mode"] == "prefill"]
    # every prefill point says whether its new-token count had run before: 3 new counts, each
    # first seen at the first cached value
    assert sum(not r["new_seen_before"] for r in prefill) == 3 * len(ARCHITECTURES)
    assert all(len(r["samples_ms"]) == 2 and r["median_ms"] > 0 for r in recs)
    assert doc["architectures"]["llama-3-8b"]["head_dim"] == 128  # tiny keeps the head size
    assert doc["architectures"]["llama-3-8b"]["hidden"] == 4096 // 16
    # the fit runs on the smoke output and names every architecture
    assert set(engine_fit.fit(doc)["architectures"]) == set(ARCHITECTURES)


def test_tiny_engine_run_on_the_cpu(tmp_path):
    pytest.importorskip("torch")
    doc = _run_tiny(tmp_path, "cpu")
    _assert_complete(doc)
    assert doc["schema"] == "kvsim-engine-bench/1" and doc["tiny_scale"] == 16
    assert doc["backend"]["mistral-7b-v0.1"]["prefill"]["backend"].startswith("flex")
    assert {r["run"] for r in doc["records"]} == {"eager"}  # no CUDA graphs on the CPU


@pytest.mark.gpu
def test_tiny_engine_run_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    doc = _run_tiny(tmp_path, "cuda")
    _assert_complete(doc)
    assert doc["provenance"]["nvml"]["driver_version"]  # raw data names its driver
    assert {r["run"] for r in doc["records"] if r["mode"] != "prefill"} == {"cuda-graph"}
    for name in ("llama-3-8b", "llama-3-70b-tp8"):
        assert doc["backend"][name]["prefill"]["backend"] in ("flash", "efficient", "cudnn")
    assert doc["backend"]["mistral-7b-v0.1"]["prefill"]["backend"] == "flex"
    assert all("first_ms" in r for r in doc["records"])  # every point's first run, timed apart


@pytest.mark.gpu
def test_tiny_engine_run_on_the_gpu_with_flash_pinned(tmp_path):
    """--prefill-attention flash: every full-attention prefill on the flash kernel, with or
    without a cache, and the attention check (against the explicit mask) still passes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for PyTorch")
    doc = _run_tiny(tmp_path, "cuda", "--prefill-attention", "flash")
    _assert_complete(doc)
    assert doc["config"]["prefill_attention"] == "flash"
    for name in ("llama-3-8b", "llama-3-70b-tp8"):
        for key in ("prefill", "prefill_uncached"):
            assert doc["backend"][name][key]["backend"] == "flash", (name, key)
        assert {r["attention"] for r in doc["records"]
                if r["arch"] == name and r["mode"] == "prefill"} == {"flash-lower-right"}


def test_the_call4_grid_reaches_the_ttft_slices_prefills_on_bucket_counts():
    from hw.bench_engine import GRID_CACHED_CALL4, GRID_NEW_CALL4
    from kvsim.llm.engine_time import bucket_list

    # the TTFT slice (call 3's runs): prefills up to 76,331 new and 76,288 cached tokens
    assert max(GRID_NEW_CALL4) >= 76331 and max(GRID_CACHED_CALL4) >= 65536
    assert set(GRID_NEW_CALL4) <= set(bucket_list(64, 64, 8, 262144))
    grid = {"new": GRID_NEW_CALL4, "cached": GRID_CACHED_CALL4}
    roles = [engine_fit.point_role({"new": n, "cached": c}, ("new", "cached"), grid)
             for n in GRID_NEW_CALL4 for c in GRID_CACHED_CALL4]
    assert roles.count("fit") == roles.count("judge") == 12


def test_the_engine_file_carries_the_kernel_and_the_bucket_rule(tmp_path):
    meas = _synthetic()
    meas["config"] = {"prefill_attention": "flash"}
    m = tmp_path / "m.json"
    m.write_text(json.dumps(meas))
    e = tmp_path / "e.json"
    assert engine_fit.main([str(m), "--engine", str(e), "--prefill-buckets", "64,64,8,262144"]) == 0
    doc = json.loads(e.read_text())
    assert doc["prefill_attention"] == "flash"
    assert doc["prefill_buckets"] == {"min": 64, "multiple": 64, "steps_per_doubling": 8,
                                      "max": 262144}
    from kvsim.llm.architectures import LLAMA_3_8B
    from kvsim.llm.engine_time import load_engine_times

    doc["architectures"] = {"llama-3-8b": doc["architectures"]["m"]}
    e.write_text(json.dumps(doc))
    times = load_engine_times(str(e), LLAMA_3_8B)
    assert times.prefill_attention == "flash" and times.padded_new(1000) == 1024
    with pytest.raises(SystemExit):
        engine_fit.main([str(m), "--engine", str(e), "--prefill-buckets", "64,64,8"])


def test_first_runs_are_split_by_whether_the_new_count_had_run():
    recs = [{"mode": "prefill", "new": 128, "cached": 0, "first_ms": 60.0, "median_ms": 1.0,
             "new_seen_before": False},
            {"mode": "prefill", "new": 128, "cached": 4096, "first_ms": 2.5, "median_ms": 2.0,
             "new_seen_before": True},
            {"mode": "prefill", "new": 512, "cached": 0, "first_ms": 41.0, "median_ms": 1.0,
             "new_seen_before": False},
            {"mode": "decode", "batch": 1, "context": 512, "first_ms": 9.0, "median_ms": 1.0}]
    out = engine_fit.first_runs(recs)
    assert out["new_count_first_seen"]["points"] == 2
    assert out["new_count_first_seen"]["median_extra_ms"] == pytest.approx(49.5)
    assert out["new_count_first_seen"]["max_extra_ms"] == pytest.approx(59.0)
    assert out["new_count_seen_before"]["median_extra_ms"] == pytest.approx(0.5)
    assert engine_fit.first_runs([{k: v for k, v in recs[0].items() if k != "first_ms"}]) == {}


def test_the_call5_grid_drops_what_ran_out_of_memory_and_splits_half_and_half():
    from hw.bench_engine import GRID_CACHED_CALL5, GRID_NEW_CALL5, GRID_PREFILL

    assert GRID_PREFILL["call5"] == (GRID_NEW_CALL5, GRID_CACHED_CALL5)
    assert max(GRID_NEW_CALL5) == 65536 and 131072 not in GRID_NEW_CALL5
    grid = {"new": GRID_NEW_CALL5, "cached": GRID_CACHED_CALL5}
    roles = {(n, c): engine_fit.point_role({"new": n, "cached": c}, ("new", "cached"), grid)
             for n in GRID_NEW_CALL5 for c in GRID_CACHED_CALL5}
    assert list(roles.values()).count("fit") == list(roles.values()).count("judge") == 15
    assert roles[(128, 0)] == "fit" and roles[(65536, 65536)] == "judge"


def _windowed_with_new_sq(g: float) -> dict:
    """call 5's grid, a windowed architecture whose prefill follows the model with ``g new^2``."""
    from hw.bench_engine import GRID_CACHED_CALL5, GRID_NEW_CALL5

    meas = _synthetic(4096)
    meas["grid"].update({"new": list(GRID_NEW_CALL5), "cached": list(GRID_CACHED_CALL5)})
    p = PREFILL
    meas["records"] = [r for r in meas["records"] if r["mode"] != "prefill"] + [
        {"mode": "prefill", "arch": "m", "new": n, "cached": c, "verified": True,
         "per_layer_ms": max(p["floor"], p["a"] + p["b_per_token"] * n
                             + p["d_per_pair"] * pairs(n, c, 4096) + p["e_per_cached"] * c + g * n * n)}
        for c in GRID_CACHED_CALL5 for n in GRID_NEW_CALL5]
    return meas


def test_the_window_term_recovers_a_new_squared_cost_the_five_terms_miss():
    meas = _windowed_with_new_sq(2e-9)
    with_g = engine_fit.fit(meas, "new_sq")["architectures"]["m"]["prefill"]
    assert with_g["terms"]["g_per_new_sq"] == pytest.approx(2e-9, rel=1e-3)
    assert with_g["errors"]["judge"]["median_ape_pct"] < 0.1
    without = engine_fit.fit(meas)["architectures"]["m"]["prefill"]
    assert "g_per_new_sq" not in without["terms"]
    assert without["errors"]["fit"]["worst_ape_pct"] > 1.0
    with pytest.raises(ValueError):
        engine_fit.fit(meas, "new_x_keys")


def test_the_window_term_leaves_full_attention_and_the_default_output_alone(tmp_path):
    full = engine_fit.fit(_synthetic(None), "new_sq")
    assert set(full["architectures"]["m"]["prefill"]["terms"]) == set(PREFILL)
    assert "prefill_windowed" not in engine_fit.fit(_synthetic(4096))["model"]
    m = tmp_path / "m.json"
    m.write_text(json.dumps(_synthetic(4096)))
    outs = []
    for extra in ([], ["--window-term", "none"]):
        e = tmp_path / "e.json"
        assert engine_fit.main([str(m), "--engine", str(e)] + extra) == 0
        outs.append(json.loads(e.read_text())["architectures"])
    assert outs[0] == outs[1]
