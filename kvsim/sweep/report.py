"""Capacity-planning report from a sweep table (``kvsim sweep-report TABLE.parquet``).

Figures, each drawn when the table has what it needs (otherwise the report says why not):

* ``resize_vs_length.png``: burst-resize latency against sequence length (history tokens), one
  line per hardware preset (its link) and copy path: the ``resize()`` call itself and the time
  until its copies are done. Burst-resize points are used when there are any.
* ``probe_p99_vs_interval.png``: probe p99 latency against the think time between one thread's
  probes (0 = closed loop, the highest rate), one line per lock policy (and hardware).
* ``hit_rate_vs_host.png``: committed-reuse hit rate against the host tier's capacity.
* ``pareto.png``: cost against latency with the Pareto front and, ringed, the cheapest
  configuration meeting ``--latency-target-ms``, for each scenario and each combination of its
  ``workload.*`` parameters: those describe the demand (sequence length, probe rate), the other
  parameters (hardware, ``sim.*``, ``manager.*``) the configuration to choose.

Cost: by default the rank of ``(cfg_hw_rank, cfg_tier_bytes)`` -- the hardware preset's place in
:data:`kvsim.sweep.points.HW_RANK` (an ordinal stand-in for platform price, cheapest first), then
the bytes of all cache tiers -- so "cheapest" means the least platform, then the least memory.
``--cost COLUMN`` uses any numeric column instead. Latency: ``--latency-metric``, else the
workload's (burst resize: ``resize_copies_done_p50_ms``; probes: ``probe_p99_ms``), else the
first of ``resize_copies_done_p50_ms``, ``resize_p50_ms``, ``probe_p99_ms`` with values. Among
points of one cost the front keeps the fastest (ties: the lowest point id).

With several values per x (other parameters varying), figure lines show the median.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any

from kvsim.report.figures import new_figure, save

LATENCY_METRICS = ("resize_copies_done_p50_ms", "resize_p50_ms", "probe_p99_ms")
GIB = 2**30


def _known_columns() -> set[str]:
    from kvsim.sweep.table import KINDS

    return set(KINDS)


def param_columns(df) -> list[str]:
    known = _known_columns()
    return [c for c in df.columns if c not in known]


def _has(df, *cols: str) -> bool:
    return all(c in df.columns and df[c].notna().any() for c in cols)


def _labels(df, cols: list[str]) -> list[str]:
    parts = [df[c].astype("string").fillna("-") for c in cols]
    out = parts[0]
    for p in parts[1:]:
        out = out + ", " + p
    return list(out)


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    try:
        import pandas as pd

        if pd.isna(v):
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _lines(ax, df, x: str, y: str, group_cols: list[str], styles: dict | None = None) -> int:
    rows = df[df[x].notna() & df[y].notna()]
    if rows.empty:
        return 0
    labels = _labels(rows, group_cols)
    rows = rows.assign(_label=labels)
    curves = {}
    for label in sorted(set(labels)):
        med = rows[rows["_label"] == label].groupby(x)[y].median().sort_index()
        curves[label] = (med.index.astype("float64").to_numpy(), med.astype("float64").to_numpy())
    # Identical lines would hide each other: each set of identical ones is drawn once, its
    # label naming them all (wrapped, so the legend stays narrow).
    merged: list[tuple[list[str], tuple]] = []
    for label, (xs, ys) in curves.items():
        for labels_, (mx, my) in merged:
            if mx.shape == xs.shape and (mx == xs).all() and \
                    (abs(my - ys) <= 1e-9 * max(abs(my).max(), 1e-300)).all():
                labels_.append(label)
                break
        else:
            merged.append(([label], (xs, ys)))
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for i, (labels_, (xs, ys)) in enumerate(merged):
        text = labels_[0] if len(labels_) == 1 else \
            f"{len(labels_)} identical: " + "; ".join(labels_)
        kw = {"marker": markers[i % len(markers)], "alpha": 0.9} | \
            ((styles or {}).get(labels_[0], {}) if len(labels_) == 1 else {})
        ax.plot(xs, ys, label=textwrap.fill(text, 48), **kw)
    return len(merged)


def _styles(df, color_cols: list[str], dash_col: str | None) -> dict[str, dict]:
    """Colour by ``color_cols``, line style by ``dash_col``; keys are the line labels."""
    cols = color_cols + ([dash_col] if dash_col else [])
    labels = sorted(set(_labels(df, cols)))
    colors = sorted(set(_labels(df, color_cols)))
    dashes = sorted(set(df[dash_col].astype("string").fillna("-"))) if dash_col else []
    cycle = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
             "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
    styles_ = ["-", "--", ":", "-."]
    out = {}
    for label in labels:
        parts = label.split(", ")
        color = ", ".join(parts[:len(color_cols)])
        kw = {"color": cycle[colors.index(color) % len(cycle)]}
        if dash_col:
            kw["linestyle"] = styles_[dashes.index(parts[-1]) % len(styles_)]
        out[label] = kw
    return out


# -- figures --------------------------------------------------------------------------------------

def fig_resize_vs_length(ok, out: Path) -> tuple[str | None, str]:
    if not _has(ok, "cfg_history_tokens", "resize_p50_ms"):
        return None, "needs burst-resize latencies (resize_p50_ms) and sequence lengths"
    rows = ok[ok["cfg_workload"] == "burst_resize"] if (ok["cfg_workload"] == "burst_resize").any() \
        else ok
    rows = rows[rows["resize_p50_ms"].notna() & rows["cfg_history_tokens"].notna()]
    if rows["cfg_history_tokens"].nunique() < 2:
        return None, "needs resize latencies at two or more sequence lengths"
    color_cols = ["cfg_hardware", "cfg_link"]
    styles = _styles(rows, color_cols, "cfg_copy_path")
    fig, axes = new_figure(11.0, 7.5, rows=2)
    _lines(axes[0], rows, "cfg_history_tokens", "resize_p50_ms", color_cols + ["cfg_copy_path"],
           styles)
    axes[0].set_ylabel("resize() call, p50 [ms]")
    axes[0].set_title("Burst resize vs sequence length, per link and copy path")
    drawn = _lines(axes[1], rows, "cfg_history_tokens", "resize_copies_done_p50_ms",
                   color_cols + ["cfg_copy_path"], styles)
    axes[1].set_ylabel("until its copies are done, p50 [ms]")
    for ax in axes:
        ax.set_xlabel("sequence length (history tokens)")
        ax.grid(True, alpha=0.3)
    for ax in axes[:2 if drawn else 1]:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out / "resize_vs_length.png")
    return "resize_vs_length.png", ("Burst-resize latency against sequence length: the call "
                                    "(top) and until its copies are done (bottom); colour = "
                                    "hardware (link), line style = copy path.")


def fig_probe_vs_interval(ok, out: Path) -> tuple[str | None, str]:
    if not _has(ok, "probe_p99_ms", "cfg_probe_interval_us"):
        return None, "needs probe latencies (probe_p99_ms) and probe intervals"
    rows = ok[ok["probe_p99_ms"].notna() & ok["cfg_probe_interval_us"].notna()]
    if rows["cfg_probe_interval_us"].nunique() < 2:
        return None, "needs probe p99 at two or more probe intervals"
    cols = ["cfg_lock_policy"] + (["cfg_hardware"] if rows["cfg_hardware"].nunique() > 1 else [])
    fig, ax = new_figure(10.0, 4.5)
    _lines(ax, rows, "cfg_probe_interval_us", "probe_p99_ms", cols)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("think time between one thread's probes [us] (0 = closed loop, highest rate)")
    ax.set_ylabel("probe_reuse p99 [ms]")
    ax.set_title("Probe p99 vs probe rate, per lock policy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out / "probe_p99_vs_interval.png")
    return "probe_p99_vs_interval.png", ("Probe p99 latency against the interval between probes "
                                         "(rate falls to the right), one line per lock policy.")


def fig_hit_rate_vs_host(ok, out: Path) -> tuple[str | None, str]:
    if not _has(ok, "hit_rate", "cfg_host_tier_bytes"):
        return None, "needs hit rates (no reuse was recorded) and host-tier capacities"
    rows = ok[ok["hit_rate"].notna() & ok["cfg_host_tier_bytes"].notna()]
    if rows["cfg_host_tier_bytes"].nunique() < 2:
        return None, "needs hit rates at two or more host-tier capacities"
    rows = rows.assign(host_gib=rows["cfg_host_tier_bytes"].astype("float64") / GIB)
    fig, ax = new_figure(8.0, 4.5)
    _lines(ax, rows, "host_gib", "hit_rate", ["scenario"])
    ax.set_xlabel("host-tier capacity [GiB]")
    ax.set_ylabel("hit rate (reused / (reused + missed) blocks)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Hit rate vs host-tier capacity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out / "hit_rate_vs_host.png")
    return "hit_rate_vs_host.png", "Committed-reuse hit rate against host-tier capacity."


# -- cost, Pareto ---------------------------------------------------------------------------------

def with_cost(ok, cost: str | None = None):
    """``ok`` with ``_cost`` (numeric) and ``_cost_label`` columns; rows without a cost dropped."""
    import pandas as pd

    if cost is not None:
        if cost not in ok.columns:
            raise ValueError(f"--cost {cost!r}: no such column")
        values = pd.to_numeric(ok[cost], errors="coerce").astype("float64")
        rows = ok.assign(_cost=values)
        rows = rows[rows["_cost"].notna()]
        return rows.assign(_cost_label=[f"{cost}={_fmt(v)}" for v in rows["_cost"]]), cost
    if not _has(ok, "cfg_tier_bytes"):
        return ok.iloc[0:0].assign(_cost=[], _cost_label=[]), "cost"
    rank = ok["cfg_hw_rank"].astype("Float64") if _has(ok, "cfg_hw_rank") else \
        pd.Series(0.0, index=ok.index, dtype="Float64")
    rows = ok.assign(_rank=rank, _bytes=ok["cfg_tier_bytes"].astype("Float64"))
    rows = rows[rows["_rank"].notna() & rows["_bytes"].notna()]
    keys = sorted({(float(r), float(b)) for r, b in zip(rows["_rank"], rows["_bytes"])})
    index = {k: i + 1 for i, k in enumerate(keys)}
    costs = [float(index[(float(r), float(b))]) for r, b in zip(rows["_rank"], rows["_bytes"])]
    labels = [f"{hw if isinstance(hw, str) else '-'} / {float(b) / GIB:.3g} GiB"
              for hw, b in zip(rows["cfg_hardware"].astype(object), rows["_bytes"])]
    return (rows.drop(columns=["_rank", "_bytes"]).assign(_cost=costs, _cost_label=labels),
            "platform rank (an ordinal, not a price: hardware preset, then tier bytes; "
            "--cost COLUMN for a price)")


def pareto_front(rows, latency: str):
    """The Pareto-optimal rows: no other row is at most as costly and strictly faster."""
    rows = rows[rows[latency].notna()]
    ordered = rows.assign(_lat=rows[latency].astype("float64")).sort_values(
        ["_cost", "_lat", "point_id"], kind="mergesort")
    keep, best = [], math.inf
    for idx, lat in zip(ordered.index, ordered["_lat"]):
        if lat < best:
            keep.append(idx)
            best = lat
    return ordered.loc[keep].drop(columns=["_lat"])


def cheapest_meeting(rows, latency: str, target: float | None):
    if target is None:
        return None
    rows = rows[rows[latency].notna()]
    meeting = rows[rows[latency].astype("float64") <= target]
    if meeting.empty:
        return None
    ordered = meeting.assign(_lat=meeting[latency].astype("float64")).sort_values(
        ["_cost", "_lat", "point_id"], kind="mergesort")
    return ordered.iloc[0]


DEFAULT_METRIC = {"burst_resize": "resize_copies_done_p50_ms", "concurrent_probe": "probe_p99_ms",
                  "seed_concurrency": "probe_p99_ms"}


def choose_latency(rows, latency_metric: str | None) -> str | None:
    """The latency column of a group: the given one, else its workload's, else the first set."""
    if latency_metric is not None:
        if latency_metric not in rows.columns:
            raise ValueError(f"--latency-metric {latency_metric!r}: no such column")
        return latency_metric
    kinds = set(rows["cfg_workload"].dropna().astype(str)) if "cfg_workload" in rows.columns else set()
    preferred = DEFAULT_METRIC.get(next(iter(kinds))) if len(kinds) == 1 else None
    if preferred is not None and _has(rows, preferred):
        return preferred
    return next((m for m in LATENCY_METRICS if _has(rows, m)), None)


def _sort_key(v: Any) -> tuple:
    if _fmt(v) == "":
        return (2, 0.0, "")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, float(v), "")
    return (1, 0.0, str(v))


def pareto_groups(costed, params: list[str], latency_metric: str | None):
    """(label, rows, latency column) per scenario and combination of ``workload.*`` parameters.

    Parameters under ``workload.`` describe the demand (sequence length, probe rate); the others
    (hardware, ``sim.*``, ``manager.*``) the configuration to choose, so each demand gets its
    own front and its own cheapest configuration.
    """
    demand = [p for p in params if p.startswith("workload.")]
    keyed = costed.assign(_group=_labels(costed, ["scenario"] + demand) if len(costed) else [])
    order = {}
    for key, *values in zip(keyed["_group"], keyed["scenario"].astype(str),
                            *(keyed[p].astype(object) for p in demand)):
        order[key] = tuple(_sort_key(v) for v in values)
    out = []
    for key in sorted(order, key=order.__getitem__):
        rows = keyed[keyed["_group"] == key]
        shown = [p for p in demand if rows[p].notna().any()]
        label = str(rows["scenario"].iloc[0]) + "".join(
            f", {p.split('.', 1)[1]}={_fmt(rows[p].iloc[0])}" for p in shown)
        latency = choose_latency(rows, latency_metric)
        if latency is not None:
            out.append((label, rows.drop(columns=["_group"]), latency))
    return out


def fig_pareto(groups, cost_name: str, target: float | None, out: Path) -> tuple[str | None, str]:
    if not groups:
        return None, "needs a cost and a latency for some point"
    fig, ax = new_figure(9.0, 5.5)
    cycle = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
             "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]
    markers = ["o", "s", "^", "D", "v", "P"]
    ticks = {}
    for i, (label, rows, latency) in enumerate(groups):
        rows = rows[rows[latency].notna()]
        color, marker = cycle[i % len(cycle)], markers[(i // len(cycle)) % len(markers)]
        ax.scatter(rows["_cost"], rows[latency].astype("float64"), color=color, alpha=0.3, s=16,
                   marker=marker)
        front = pareto_front(rows, latency)
        ax.step(front["_cost"], front[latency].astype("float64"), where="post", color=color,
                marker=marker, label=f"{label} ({latency})")
        best = cheapest_meeting(rows, latency, target)
        if best is not None:
            ax.scatter([best["_cost"]], [float(best[latency])], s=200, facecolors="none",
                       edgecolors=color, linewidths=2)
        ticks.update(zip(rows["_cost"], rows["_cost_label"]))
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g} ms")
    if len(ticks) <= 12:
        xs = sorted(ticks)
        ax.set_xticks(xs, [ticks[x] for x in xs], rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel(cost_name)
    ax.set_ylabel("latency [ms] (metric in the legend)")
    ax.set_title("Cost vs latency: Pareto front per scenario and workload")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="best")
    save(fig, out / "pareto.png")
    return "pareto.png", ("Every point (faint), the Pareto front of each scenario and workload "
                          "(steps) and, ringed, the cheapest configuration meeting the target; "
                          f"cost = {cost_name}.")


# -- the report -----------------------------------------------------------------------------------

def _md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(v).replace("|", "\\|") for v in r) + " |" for r in rows]
    return out


def _params_text(row, params: list[str]) -> str:
    return ", ".join(f"{p}={_fmt(row[p])}" for p in params if _fmt(row[p]) != "")


def write_sweep_report(table, out_dir: str | Path, latency_target_ms: float | None = None,
                       latency_metric: str | None = None, cost: str | None = None,
                       sweep: dict | None = None) -> Path:
    """Write ``report.md`` and its figures into ``out_dir``; returns the report's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = table.reset_index(drop=True)
    if sweep is None and (out / "sweep.json").exists():
        sweep = json.loads((out / "sweep.json").read_text())
    params = param_columns(df)
    ok = df[df["status"] == "ok"]
    failed = df[df["status"] != "ok"]
    name = (sweep or {}).get("name") or ", ".join(sorted(set(df["scenario"].astype(str))))
    lines = [f"# Sweep report: {name}", ""]
    lines.append(f"{len(df)} points: {len(ok)} ok, {len(failed)} failed"
                 + (f"; sweep seed {sweep['seed']}" if sweep and "seed" in sweep else "")
                 + ". Table: `results.parquet` (also `results.csv`), one row per point.")
    lines.append("")
    if sweep:
        for part in sweep.get("parts", []):
            desc = ", ".join(f"`{k}` in {v}" for k, v in part["params"].items()) or "no parameters"
            draw = part["method"] + (f" (sample {part['sample']})" if part.get("sample") else "")
            lines.append(f"- `{part['scenario']}` ({part['name']}): {desc}; {draw}")
        lines.append("")

    lines += ["## Figures", ""]
    for title, fn in (("Burst-resize latency vs sequence length", fig_resize_vs_length),
                      ("Probe p99 vs probe rate", fig_probe_vs_interval),
                      ("Hit rate vs host-tier capacity", fig_hit_rate_vs_host)):
        lines += [f"### {title}", ""]
        path, caption = fn(ok, out) if not ok.empty else (None, "no point finished")
        lines += ([f"![{title}]({path})", "", caption] if path else [f"Not drawn: {caption}."])
        lines.append("")

    lines += ["## Cost vs latency (Pareto view)", ""]
    costed, cost_name = with_cost(ok, cost)
    groups = pareto_groups(costed, params, latency_metric)
    path, caption = fig_pareto(groups, cost_name, latency_target_ms, out)
    lines += ([f"![Pareto view]({path})", "", caption] if path else [f"Not drawn: {caption}."])
    lines.append("")
    if groups:
        config = [p for p in params if not p.startswith("workload.")]
        body, cheapest = [], []
        for label, rows, latency in groups:
            for _, r in pareto_front(rows, latency).iterrows():
                body.append([label, _params_text(r, config), r["_cost_label"], latency,
                             r[latency], r["point_id"]])
            if latency_target_ms is not None:
                best = cheapest_meeting(rows, latency, latency_target_ms)
                cheapest.append(
                    f"- {label}: " + (f"{_params_text(best, config)} ({best['_cost_label']}): "
                                      f"{latency} = {_fmt(best[latency])} ms, point "
                                      f"`{best['point_id']}`" if best is not None else
                                      f"none meets {latency} <= {latency_target_ms:g} ms"))
        lines += [f"Pareto-optimal points per scenario and workload (cost: {cost_name}):", ""]
        lines += _md_table(["scenario, workload", "configuration", "cost", "latency metric",
                            "latency [ms]", "point_id"], body) + [""]
        if latency_target_ms is not None:
            lines += [f"Cheapest configuration meeting {latency_target_ms:g} ms:", ""]
            lines += cheapest + [""]
        else:
            lines += ["(No `--latency-target-ms` given: no cheapest configuration marked.)", ""]

    if not failed.empty:
        lines += ["## Failed points", "", "Re-running the sweep into this directory retries them.", ""]
        rows = [[r["point_id"], r["scenario"], _params_text(r, params), r["error"]]
                for _, r in failed.head(50).iterrows()]
        lines += _md_table(["point_id", "scenario", "parameters", "error"], rows)
        if len(failed) > 50:
            lines.append(f"... and {len(failed) - 50} more (see the table).")
        lines.append("")
    report = out / "report.md"
    report.write_text("\n".join(lines).rstrip("\n") + "\n")
    return report
