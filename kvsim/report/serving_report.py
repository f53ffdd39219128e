"""The serving part of a scenario's report: TTFT and what it is made of, from the results'
``workload_summary`` (a serving workload's, :mod:`kvsim.serving.stats`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.report.figures import new_figure, save


def is_serving(results: dict) -> bool:
    return "ttft_p50_ms" in (results.get("workload_summary") or {})


def serving_answer(results: dict) -> str:
    s = results["workload_summary"]
    if not s["first_token"]:
        return f"No request of {s['requests']} got its first token ({s['failed']} failed)."
    return (f"{s['first_token']} of {s['requests']} requests got their first token: TTFT p50 "
            f"{s['ttft_p50_ms']:.1f} ms, p99 {s['ttft_p99_ms']:.1f} ms (queue p50 "
            f"{s['queue_p50_ms']:.1f} ms, copy wait p50 {s['copy_wait_p50_ms']:.2f} ms); "
            f"{100 * s['hit_rate']:.1f} % of prompt tokens reused, {s['onboarded_pages']['host']} "
            f"pages onboarded from the host and {s['onboarded_pages']['disk']} from the disk; "
            f"the GPU computed {s['gpu_busy_s']:.1f} s ({s['prefill_s']:.1f} s prefill) in "
            f"{s['passes']} passes; {s['failed']} requests failed.")


def _figure(rows: list[dict], path: Path) -> None:
    fig, (a, b) = new_figure(11.0, 4.0, cols=2)
    done = [r for r in rows if r["ttft_ms"] is not None]
    ttft = np.sort([r["ttft_ms"] for r in done])
    a.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft))
    a.set(xscale="log", xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT, CDF")
    b.scatter([r["arrival_ms"] / 1e3 for r in done], [r["ttft_ms"] for r in done], s=4,
              c=[r["cached_tokens"] / max(r["input_tokens"], 1) for r in done], cmap="viridis")
    b.set(yscale="log", xlabel="arrival (s)", ylabel="TTFT (ms)",
          title="TTFT by arrival (colour: share of the prompt reused)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    save(fig, path)


def serving_section(results: dict, out_dir: Path) -> list[str]:
    s = results["workload_summary"]
    moved = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in s["moved_bytes"].items()) or "nothing"
    lines = ["## Serving", "", "| figure | p50 | p90 | p99 | mean |", "|---|---|---|---|---|",
             f"| TTFT (ms) | {s['ttft_p50_ms']:.1f} | {s['ttft_p90_ms']:.1f} | "
             f"{s['ttft_p99_ms']:.1f} | {s['ttft_mean_ms']:.1f} |",
             f"| queue (ms) | {s['queue_p50_ms']:.1f} | | {s['queue_p99_ms']:.1f} | |",
             f"| copy wait (ms) | {s['copy_wait_p50_ms']:.2f} | | {s['copy_wait_p99_ms']:.2f} | "
             f"{s['copy_wait_mean_ms']:.2f} |", "",
             f"Tokens reused {s['reused_tokens']:,}, recomputed {s['recomputed_tokens']:,}; moved: "
             f"{moved}; admissions retried for want of GPU room: {s['admission_retries']}. Every "
             "request's row is under `workload_summary.per_request` in results.json.", ""]
    if s["first_token"]:
        _figure(s["per_request"], out_dir / "ttft.png")
        lines += ["![TTFT](ttft.png)", ""]
    return lines
