"""``kvsim tiers``: what a host or disk KV tier buys a serving engine, swept and reported.

From a serving scenario (:mod:`kvsim.serving.engine`; its GPU tier is level 0 of its manager),
:func:`tier_sweep` builds a sweep (:mod:`kvsim.sweep`: local or Dask backend, resumable) over
host-tier sizes, disk-tier sizes and drives, and hardware presets (their CPU-GPU link); sizes
are in tokens of the scenario's architecture. A disk tier needs a host tier (the levels run GPU,
host, disk), so disk sizes other than 0 are combined with host sizes other than 0 only.

:func:`write_tier_report` turns the table into ``report.md`` with figures: per configuration the
hit rate, TTFT p50/p99, queueing, copy wait, GPU-seconds and what they save against the same
hardware without extra tiers; the break-even of onboarding; and a one-line recommendation.

**Break-even.** Onboarding a reused token costs ``kv_bytes_per_token / link rate`` of copy time;
recomputing it costs the prefill model's time per token (a whole median prompt, nothing
cached, divided by its tokens). Below the link rate where the two are equal a reused token is
cheaper to recompute. The sweep shows the rest: a tier pays while TTFT falls as it grows; the
report names the smallest size within :data:`KNEE_PCT` of its series' best TTFT p50, and says
where TTFT rises again.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.llm.architectures import Architecture
from kvsim.llm.engine_time import load_engine_times
from kvsim.scenario.schema import Scenario
from kvsim.scenario.source import load_yaml
from kvsim.serving.engine import serving_architecture
from kvsim.sweep.spec import Part, Sweep, load_sweep_scenario, scenario_hash

KNEE_PCT = 2.0  # "within 2 % of the best": the tier past which more buys little


class TierError(KvsimError):
    """A tiers command line that cannot be swept."""


@dataclass(frozen=True)
class TierPlan:
    scenario_file: str
    name: str
    arch: Architecture
    bytes_per_token: int
    gpu_tokens: int
    engine_times: str
    scenario: Scenario = field(compare=False, repr=False)  # the file, parsed
    data: dict = field(compare=False, repr=False)  # the file as loaded (no sweep: block)


def plan_of(scenario_file: str) -> TierPlan:
    """The serving scenario, loaded and checked once, and what the sweep needs of it."""
    sf, _ = load_sweep_scenario(scenario_file)
    sc = sf.base
    if sc.workload.kind != "serving":
        raise TierError(f"{scenario_file}: kvsim tiers needs a serving workload "
                        f"(workload.kind: serving), got {sc.workload.kind}")
    if sc.executor != "sim":
        raise TierError(f"{scenario_file}: kvsim tiers runs the simulator (executor: sim)")
    arch = serving_architecture(sc.workload)
    return TierPlan(scenario_file, sc.name, arch, arch.kv_bytes_per_token,
                    sc.manager.levels[0].quota_bytes // arch.kv_bytes_per_token,
                    sc.workload.engine_times, sc, sf.data)


def _derived(plan: TierPlan, host: int, disk: int, out: Path) -> str:
    """A copy of the scenario with these tiers (its paths relative to the copy), in
    ``out/scenarios``;
    its path. The sweep's points name these files, so a re-run resumes."""
    import yaml

    data, sc = dict(plan.data), plan.scenario
    folder = out / "scenarios"
    folder.mkdir(exist_ok=True)

    def here(path: str) -> str:  # relative to the new file, so the directory can move
        return os.path.relpath(Path(path).resolve(), folder.resolve())

    data["workload"] = dict(data["workload"], trace=here(sc.workload.trace))
    if sc.workload.engine_times.endswith(".json"):
        data["workload"]["engine_times"] = here(sc.workload.engine_times)
    for key in ("hardware", "cpu_model"):
        if str(data.get(key, "")).endswith(".json"):
            data[key] = here(getattr(sc, key))
    gpu = sc.manager.levels[0]
    levels = [{"name": gpu.name, "quota_bytes": gpu.quota_bytes}]
    if host:
        levels.append({"name": "host", "quota_bytes": host * plan.bytes_per_token})
    if disk:
        levels.append({"name": "disk", "quota_bytes": disk * plan.bytes_per_token})
    data["manager"] = dict(data["manager"], levels=levels)
    path = folder / f"host-{_tokens(host)}-disk-{_tokens(disk)}.yaml"
    path.write_text(f"# written by kvsim tiers from {plan.scenario_file}\n"
                    + yaml.safe_dump(data, sort_keys=False))
    return str(path)


def tier_sweep(plan: TierPlan, out: Path, host_tokens: list[int], disk_tokens: list[int],
               hardware: list[str], disks: list[str], drives: int = 1) -> Sweep:
    """The sweep of every (host, disk) size with every hardware preset (and disk drive); the
    scenario files it runs are written into ``out`` (a kvsim output directory)."""
    if any(disk_tokens) and not disks:
        raise TierError("--disk-tokens other than 0 needs --disk (a drive preset)")
    if not hardware:
        hardware = [plan.scenario.hardware]
    combos = [(h, 0) for h in host_tokens if 0 in disk_tokens]
    combos += [(h, d) for h in host_tokens if h for d in disk_tokens if d]
    if not combos:
        raise TierError("no configuration to run: a disk tier needs a host tier "
                        "(give --host-tokens other than 0)")
    parts = []
    for host, disk in dict.fromkeys(combos):
        path = _derived(plan, host, disk, out)
        params: tuple = (("hardware", tuple(hardware)),)
        fixed: tuple = ()
        if disk:
            params += (("sim.disk", tuple(disks)),)
            fixed = (f"sim.disk_drives={drives}",)
        # the point's identity hashes the file's content, as kvsim.sweep.spec does when it runs
        parts.append(Part(path, plan.name, scenario_hash(load_yaml(path)[0], path), params,
                          fixed=fixed))
    return Sweep(f"tiers-{plan.name}", 0, tuple(parts), plan.scenario_file)


# -- the report -------------------------------------------------------------------------------------
def _configs(table, plan: TierPlan) -> list[dict]:
    """One dict per finished point, with its tiers in tokens and its savings vs baseline."""
    rows = [r for r in table.to_dict("records") if r["status"] == "ok"]
    for r in rows:
        r["host_tokens"] = int(r["cfg_host_tier_bytes"]) // plan.bytes_per_token
        r["disk_tokens"] = int(r["cfg_disk_tier_bytes"]) // plan.bytes_per_token
        r["extra_tokens"] = r["host_tokens"] + r["disk_tokens"]
        r["series"] = f"{r['cfg_hardware']}" + (
            f", disk {_tokens(r['disk_tokens'])} {r['cfg_disk']}" if r["cfg_disk"] else "")
    for r in rows:
        same = [b for b in rows if b["cfg_hardware"] == r["cfg_hardware"] and b["extra_tokens"] == 0]
        base = same[0] if same else None
        r["baseline"] = base is not None
        r["gpu_s_saved"] = None if base is None else base["gpu_busy_s"] - r["gpu_busy_s"]
        r["gpu_pct_saved"] = (None if base is None or not base["gpu_busy_s"]
                              else 100.0 * r["gpu_s_saved"] / base["gpu_busy_s"])
        r["ttft_p50_base"] = None if base is None else base["ttft_p50_ms"]
        r["ttft_p99_base"] = None if base is None else base["ttft_p99_ms"]
    rows.sort(key=lambda r: (r["cfg_hardware"], str(r["cfg_disk"]), r["host_tokens"],
                             r["disk_tokens"]))
    return rows


def break_even(plan: TierPlan, median_prompt: int) -> dict[str, float]:
    """Recompute time per token, and the link rate below which onboarding costs more."""
    times = load_engine_times(plan.engine_times, plan.arch)
    per_token_s = times.prefill_seconds(median_prompt, 0) / median_prompt
    return {"median_prompt_tokens": median_prompt, "recompute_us_per_token": per_token_s * 1e6,
            "break_even_gbps": plan.bytes_per_token / per_token_s / 1e9}


def knees(rows: list[dict]) -> dict[str, dict]:
    """Per series (hardware, disk): the smallest host tier within KNEE_PCT of the best TTFT
    p50, and the first size whose TTFT p50 is worse than the one before (if any)."""
    out: dict[str, dict] = {}
    for series in sorted({r["series"] for r in rows}):
        pts = sorted((r for r in rows if r["series"] == series and r["ttft_p50_ms"] is not None),
                     key=lambda r: r["host_tokens"])
        if not pts:
            continue
        best = min(p["ttft_p50_ms"] for p in pts)
        knee = next(p for p in pts if p["ttft_p50_ms"] <= best * (1 + KNEE_PCT / 100))
        worse = next((b for a, b in zip(pts, pts[1:])
                      if b["ttft_p50_ms"] > a["ttft_p50_ms"] * (1 + KNEE_PCT / 100)), None)
        out[series] = {"knee": knee, "best_ms": best, "rises_at": worse}
    return out


def recommendation(rows: list[dict], plan: TierPlan) -> str:
    """One line: the smallest configuration within KNEE_PCT of the best TTFT p50 overall."""
    pts = [r for r in rows if r["ttft_p50_ms"] is not None]
    if not pts:
        return "No point finished: nothing to recommend."
    best = min(r["ttft_p50_ms"] for r in pts)
    pick = min((r for r in pts if r["ttft_p50_ms"] <= best * (1 + KNEE_PCT / 100)),
               key=lambda r: (r["extra_tokens"], r["cfg_hardware"]))
    if pick["extra_tokens"] == 0:
        return (f"Keep the GPU tier alone on {pick['cfg_hardware']}: no host or disk tier in the "
                f"sweep lowers TTFT p50 by more than {KNEE_PCT:g} % (p50 {pick['ttft_p50_ms']:.0f} ms).")
    tiers = _tier_text(pick, plan)
    if pick["ttft_p50_base"] is None:
        return f"Use {tiers} on {pick['cfg_hardware']}: TTFT p50 {pick['ttft_p50_ms']:.0f} ms."
    return (f"Add {tiers} on {pick['cfg_hardware']}: TTFT p50 {pick['ttft_p50_base']:.0f} -> "
            f"{pick['ttft_p50_ms']:.0f} ms, p99 {pick['ttft_p99_base']:.0f} -> "
            f"{pick['ttft_p99_ms']:.0f} ms, {pick['gpu_pct_saved']:.0f} % less GPU time; larger "
            f"tiers in the sweep gain under {KNEE_PCT:g} % more.")


def _tokens(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1e6 else (f"{n / 1e3:g}k" if n >= 1e3 else str(n))


def _tier_text(r: dict, plan: TierPlan) -> str:
    parts = []
    if r["host_tokens"]:
        parts.append(f"a host tier of {_tokens(r['host_tokens'])} tokens "
                     f"({r['host_tokens'] * plan.bytes_per_token / 1e9:.0f} GB)")
    if r["disk_tokens"]:
        parts.append(f"a disk tier of {_tokens(r['disk_tokens'])} tokens "
                     f"({r['disk_tokens'] * plan.bytes_per_token / 1e12:.2f} TB, {r['cfg_disk']})")
    return " and ".join(parts)


def _figures(rows: list[dict], out: Path) -> list[tuple[str, str]]:
    from kvsim.report.figures import new_figure, save

    series = sorted({r["series"] for r in rows})
    fig, (a, b, c) = new_figure(13.0, 3.8, cols=3)
    for s in series:
        pts = sorted((r for r in rows if r["series"] == s), key=lambda r: r["host_tokens"])
        x = [r["host_tokens"] / 1e6 for r in pts]
        line = a.plot(x, [r["ttft_p50_ms"] for r in pts], "o-", label=f"{s} p50")[0]
        a.plot(x, [r["ttft_p99_ms"] for r in pts], "s--", color=line.get_color(), label=f"{s} p99")
        b.plot(x, [100 * r["serving_hit_rate"] for r in pts], "o-", label=s)
        c.plot(x, [r["prefill_s"] for r in pts], "o-", label=s)
    a.set(xlabel="host tier (million tokens)", ylabel="TTFT (ms)", yscale="log",
          title="Time to first token")
    b.set(xlabel="host tier (million tokens)", ylabel="reused tokens (%)", title="Hit rate")
    c.set(xlabel="host tier (million tokens)", ylabel="prefill GPU time (s)",
          title="Prefill compute (what reuse saves)")
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, out / "tiers.png", palette=64)
    return [("tiers.png", "TTFT p50/p99, hit rate and prefill GPU time against the host tier's "
                          "size, a line per hardware and disk tier")]


def write_tier_report(table, out_dir: str | Path, plan: TierPlan, median_prompt: int,
                      wall_s: float | None = None) -> Path:
    out = Path(out_dir)
    rows = _configs(table, plan)
    failed = [r for r in table.to_dict("records") if r["status"] != "ok"]
    be = break_even(plan, median_prompt)
    lines = [f"# What a host or disk tier buys: {plan.name}", "",
             f"**Recommendation.** {recommendation(rows, plan)}", "",
             f"Architecture {plan.arch.name} ({plan.bytes_per_token / 1024:g} KiB of KV per token "
             f"and GPU, {plan.arch.source}); GPU tier {_tokens(plan.gpu_tokens)} tokens; engine "
             f"times {plan.engine_times}; scenario `{plan.scenario_file}`."
             + f" {len(rows)} points; the simulator ran them in {_point_seconds(table):.0f} s "
             "(the sum of the points' wall times)"
             + (f", this invocation took {wall_s:.0f} s." if wall_s is not None else "."), ""]
    if failed:
        lines += [f"{len(failed)} point(s) failed: " + "; ".join(str(r["error"]) for r in failed[:3]),
                  ""]
    lines += ["| hardware | disk | host tier | disk tier | hit rate | TTFT p50 ms | TTFT p99 ms | "
              "queue p50 ms | copy wait p50 ms | prefill s | GPU busy s | GPU busy | GPU s saved | "
              "failed |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        saved = "" if r["gpu_s_saved"] is None else f"{r['gpu_s_saved']:.1f} ({r['gpu_pct_saved']:.0f} %)"
        busy = f"{100 * r['gpu_busy_s'] / r['sim_end_s']:.0f} %" if r["sim_end_s"] else "-"
        lines.append(f"| {r['cfg_hardware']} | {r['cfg_disk'] or '-'} | {_tokens(r['host_tokens'])} | "
                     f"{_tokens(r['disk_tokens'])} | {100 * r['serving_hit_rate']:.1f} % | "
                     f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['queue_p50_ms']:.1f} | "
                     f"{r['copy_wait_p50_ms']:.2f} | {r['prefill_s']:.1f} | {r['gpu_busy_s']:.1f} | "
                     f"{busy} | {saved} | {r['failed_requests']} |")
    lines += ["", "GPU busy: the modelled prefill and decode time of every pass over the run's "
              "simulated time. GPU seconds saved are against the same hardware with the GPU tier "
              "alone; they include decode: a slower engine batches more decoding requests per "
              "pass, which costs fewer seconds, so compare the prefill seconds for the compute "
              "the reuse saved."]
    lines.append("")
    for name, caption in _figures(rows, out) if rows else []:
        lines += [f"![{caption}]({name})", "", f"*{caption}.*", ""]
    lines += ["## Break-even", "",
              f"Recomputing costs {be['recompute_us_per_token']:.1f} us per token (the prefill "
              f"model on a median prompt of {be['median_prompt_tokens']} tokens, nothing cached); "
              f"onboarding a token moves {plan.bytes_per_token / 1024:g} KiB, so below "
              f"**{be['break_even_gbps']:.1f} GB/s** a reused token costs more to copy than to "
              "recompute (before queueing and overlap).", ""]
    for series, k in knees(rows).items():
        text = (f"* {series}: TTFT p50 within {KNEE_PCT:g} % of its best ({k['best_ms']:.0f} ms) "
                f"from a host tier of {_tokens(k['knee']['host_tokens'])} tokens")
        if k["rises_at"] is not None:
            text += (f"; it rises again at {_tokens(k['rises_at']['host_tokens'])} "
                     "(onboarding stops paying there)")
        lines.append(text + ".")
    lines += ["", "Per point: `results.csv` / `results.parquet` in this directory (the sweep "
              "table, every column documented in `kvsim/sweep/points.py`).", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _point_seconds(table) -> float:
    return float(sum(w for w in table["wall_s"] if w == w and w is not None))


def median_prompt_tokens(plan: TierPlan) -> int:
    from kvsim.serving.engine import load_requests

    reqs = load_requests(plan.scenario.workload)
    return int(statistics.median(r.input_length for r in reqs))

