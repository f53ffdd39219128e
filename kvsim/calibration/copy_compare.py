"""Predicted-vs-measured report for copy batches: a copy-bench measurement against a preset."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from kvsim.calibration.copy_fit import FIT_RULES, Comparison, summary
from kvsim.hardware.spec import HardwareSpec
from kvsim.report.figures import new_figure, save

SECTION_TITLES = {
    "contiguous_ce": "Contiguous copies, copy engine (cudaMemcpyAsync)",
    "paged_ce": "Paged copies, copy engine (per page / batched)",
    "kernel_cta_sweep": "LDGSTS kernel, CTA sweep (1 MiB pages)",
    "kernel_page_sweep": "LDGSTS kernel, page-size sweep",
    "kernel_contiguous_reference": "LDGSTS kernel, contiguous slots",
    "kernel_bidirectional": "LDGSTS kernel, both directions at once",
    "kernel_unaligned": "Alignment-agnostic kernel",
}


def _figure(rows: list[Comparison], path: Path) -> None:
    fig, ax = new_figure(7.0, 6.0)
    for section in SECTION_TITLES:
        sel = [c for c in rows if c.observation.section == section]
        if not sel:
            continue
        meas = [c.observation.measured_gbps for c in sel]
        pred = [c.observation.num_bytes / c.predicted_s / 1e9 for c in sel]
        ax.scatter(meas, pred, s=14, label=SECTION_TITLES[section])
    lo, hi = 0.5, 120
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.plot([lo, hi], [lo * 1.1, hi * 1.1], color="grey", linewidth=0.5, linestyle=":")
    ax.plot([lo, hi], [lo / 1.1, hi / 1.1], color="grey", linewidth=0.5, linestyle=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured GB/s")
    ax.set_ylabel("predicted GB/s")
    ax.set_title("Copy batches: predicted vs measured (dotted: +-10 %)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    save(fig, path)


def write_comparison(hw: HardwareSpec, rows: list[Comparison], measurement_file: str,
                     out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    stats = summary(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["section", "name", "role", "path", "direction", "page_bytes", "pages", "ctas",
                "inflight_bytes", "bidirectional", "aligned", "measured_ms", "predicted_ms",
                "measured_gbps", "predicted_gbps", "error_pct"])
    for c in rows:
        o = c.observation
        w.writerow([o.section, o.name, o.role, o.path, o.direction, o.page_bytes, o.pages, o.ctas,
                    o.inflight, o.bidirectional, o.aligned, f"{o.measured_s * 1e3:.6f}",
                    f"{c.predicted_s * 1e3:.6f}", f"{o.measured_gbps:.4f}",
                    f"{o.num_bytes / c.predicted_s / 1e9:.4f}", f"{c.error_pct:.3f}"])
    (out_dir / "comparison.csv").write_text(buf.getvalue())
    (out_dir / "summary.json").write_text(json.dumps(
        {"hardware": hw.name, "measurement": measurement_file, "summary": stats,
         "fit_rules": FIT_RULES}, indent=1, sort_keys=True) + "\n")
    _figure(rows, out_dir / "predicted_vs_measured.png")
    lines = [
        f"# Copy model `{hw.name}` against `{measurement_file}`",
        "",
        "Each row is one measured copy batch (the median of its samples) and the model's prediction "
        "for the same batch (`kvsim copy-model`). Error = (predicted - measured) / measured time.",
        "**fit** rows set a parameter; **judge** rows set nothing and are the honest test.",
        "",
        "## Summary (absolute percentage error of the batch time)",
        "",
        "| set | rows | median APE | worst APE | within 5 % | within 10 % |",
        "|---|---|---|---|---|---|",
    ]
    for key, s in stats.items():
        if s.get("count"):
            lines.append(f"| {key} | {s['count']} | {s['median_ape_pct']:.2f} % | "
                         f"{s['worst_ape_pct']:.2f} % | {s['within_5pct']} | {s['within_10pct']} |")
    lines += ["", "![predicted vs measured](predicted_vs_measured.png)", "",
              "## What was fitted to what", ""]
    lines += [f"* `{k}`: {v}" for k, v in FIT_RULES.items()]
    for section, title in SECTION_TITLES.items():
        sel = [c for c in rows if c.observation.section == section]
        if not sel:
            continue
        lines += ["", f"## {title}", "", "| batch | set | measured ms | predicted ms | measured GB/s "
                  "| predicted GB/s | error |", "|---|---|---|---|---|---|---|"]
        for c in sel:
            o = c.observation
            lines.append(f"| {o.label()} | {o.role} | {o.measured_s * 1e3:.4f} | "
                         f"{c.predicted_s * 1e3:.4f} | {o.measured_gbps:.2f} | "
                         f"{o.num_bytes / c.predicted_s / 1e9:.2f} | {c.error_pct:+.1f} % |")
    (out_dir / "README.md").write_text("\n".join(lines) + "\n")
    return stats
