"""The report of one scenario run: report.md plus figures, drawn from the results object alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.report.figures import new_figure, save
from kvsim.report.serving_report import is_serving, serving_answer, serving_section

MAX_CALL_ROWS = 60


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


# -- plan executor figures ----------------------------------------------------------------------

def _occupancy_figure(results: dict, path: Path) -> None:
    calls = results["calls"]
    x = [c["index"] for c in calls]
    fig, ax = new_figure()
    for level, name in enumerate(results["levels"]):
        total = calls[0]["occupancy"][level]["total"] if calls else 0
        used = [c["occupancy"][level]["total"] - c["occupancy"][level]["free"] for c in calls]
        evictable = [c["occupancy"][level]["evictable"] for c in calls]
        line, = ax.plot(x, [u / total if total else 0.0 for u in used], marker="o",
                        label=f"{name}: used / {total} slots")
        ax.plot(x, [e / total if total else 0.0 for e in evictable], linestyle="--",
                color=line.get_color(), label=f"{name}: evictable")
    ax.set_xlabel("call index")
    ax.set_ylabel("fraction of the level's slots")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("Tier occupancy after each call")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    save(fig, path)


def _migration_figure(results: dict, path: Path) -> None:
    calls = results["calls"]
    x = [c["index"] for c in calls]
    fig, ax = new_figure()
    width = 0.4
    ax.bar([i - width / 2 for i in x], [c["offloaded_pages"] for c in calls], width,
           label="offloaded (to a colder level)")
    ax.bar([i + width / 2 for i in x], [c["onboarded_pages"] for c in calls], width,
           label="onboarded (to the GPU)")
    ax.set_xlabel("call index")
    ax.set_ylabel("pages")
    ax.set_title("Pages migrated by each call")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    save(fig, path)


# -- sim executor figures --------------------------------------------------------------------

LINK_SEGMENTS_DRAWN = 2000  # above this many rate segments the link plot shows binned means
LINK_BINS = 400


def _link_bins(segs: list, col: int = 2) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean rate of column ``col`` per time bin: (bin starts in ms, GB/s, bin width in ms).

    The rate is piecewise constant, so its integral is piecewise linear through the segment
    ends; a bin's mean is the integral's rise across the bin over its width (gaps count as 0).
    """
    a = np.asarray(segs, dtype=float)
    starts, ends, rate = a[:, 0], a[:, 1], a[:, col]
    area = np.cumsum(rate * (ends - starts))
    t = np.column_stack([starts, ends]).ravel()
    f = np.column_stack([area - rate * (ends - starts), area]).ravel()
    edges = np.linspace(0.0, ends.max(), LINK_BINS + 1)
    width = edges[1] - edges[0]
    mean = np.diff(np.interp(edges, t, f, left=0.0)) / width
    return edges[:-1] * 1e3, np.append(mean, mean[-1])[:-1], width * 1e3


def _timeline_figure(results: dict, path: Path) -> None:
    """Per thread: lock waits (light) and holds (dark); below, link GB/s per direction.

    Long runs are drawn in seconds, with holds and waits at least 1/1500 of the axis wide (so a
    0.1 ms hold in a 1000 s run stays visible) and the link as mean rates per time bin."""
    calls = [c for c in results["calls"] if c.get("lock_requested_ms") is not None]
    threads = sorted({c["thread"] for c in results["calls"]})
    end_ms = results.get("sim", {}).get("end_time_s", results.get("hw", {}).get("end_time_s", 0)) * 1e3
    segs = results.get("link", {}).get("segments", [])
    ends = [c["start_ms"] + c["latency_ms"] for c in results["calls"] if c.get("latency_ms") is not None]
    ends += [s[1] * 1e3 for s in segs]
    xmax_ms = max(ends, default=1.0) * 1.02
    unit, per_ms = ("s", 1e-3) if xmax_ms > 10_000 else ("ms", 1.0)
    min_width = xmax_ms * per_ms / 1500 if unit == "s" else 0.0
    fig, (ax, ax_link) = new_figure(9.0, 6.0, rows=2)
    for row, thread in enumerate(threads):
        mine = [c for c in calls if c["thread"] == thread]
        # A wait never granted, or a hold never released (a deadlock), runs to the end of the run.
        waits = [(c["lock_requested_ms"], (c["lock_granted_ms"] if c["lock_granted_ms"] is not None
                                           else end_ms) - c["lock_requested_ms"]) for c in mine]
        holds = [(c["lock_granted_ms"], (c["lock_released_ms"] if c["lock_released_ms"] is not None
                                         else end_ms) - c["lock_granted_ms"])
                 for c in mine if c["lock_granted_ms"] is not None]
        waits = [(a * per_ms, max(w * per_ms, min_width)) for a, w in waits if w > 0]
        holds = [(a * per_ms, max(w * per_ms, min_width)) for a, w in holds]
        ax.broken_barh(waits, (row - 0.4, 0.8), facecolors="#f4b183",
                       label="wait" if row == 0 else None)
        ax.broken_barh(holds, (row - 0.4, 0.8), facecolors="#2f5597", label="hold" if row == 0 else None)
    marks = [(v["time"], v["thread"], "violation") for v in results["violations"] if "time" in v]
    marks += [(d["time"], t["thread"], "deadlock") for d in results["deadlocks"]
              if d["kind"] == "deadlock" for t in d["cycle"]]
    for kind, marker in (("violation", "x"), ("deadlock", "X")):
        pts = [(t * 1e3 * per_ms, threads.index(th)) for t, th, k in marks
               if k == kind and th in threads]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color="red",
                       s=60, zorder=5, label=kind)
    step = max(1, -(-len(threads) // 24))  # at most ~24 row labels
    ax.set_yticks(range(0, len(threads), step))
    ax.set_yticklabels(threads[::step], fontsize=7)
    ax.set_title("Manager lock: waits and holds per thread"
                 + (f" (drawn at least {min_width:.2g} {unit} wide)" if min_width else ""))
    # A fixed place beside the bars: loc="best" scans every bar and took most of a long run's
    # report time (70K calls: ~45 s).
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    binned = len(segs) > LINK_SEGMENTS_DRAWN
    title = "Link utilisation"
    for col, name in ((2, "offload (GPU->host)"), (3, "onboard (host->GPU)")):
        if not segs:
            break
        if binned:
            xs, ys, width_ms = _link_bins(segs, col)
            ax_link.step(xs * per_ms, ys, where="post", label=name)
            title = f"Link utilisation (mean per bin of {width_ms * per_ms:.3g} {unit})"
        else:
            xs, ys = [], []
            for s in segs:
                xs += [s[0] * 1e3 * per_ms, s[1] * 1e3 * per_ms]
                ys += [s[col], s[col]]
            ax_link.plot(xs, ys, label=name)
    ax_link.set_xlabel(f"simulated time ({unit})")
    ax_link.set_ylabel("link GB/s")
    ax_link.set_title(title)
    if segs:
        ax_link.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax_link.grid(alpha=0.3)
    ax.set_xlim(0, xmax_ms * per_ms)
    ax_link.set_xlim(0, xmax_ms * per_ms)
    save(fig, path)


def _latency_cdf_figure(results: dict, path: Path) -> None:
    fig, ax = new_figure()
    by_api: dict[str, list[float]] = {}
    for c in results["calls"]:
        if c.get("latency_ms") is not None:
            by_api.setdefault(c["api"], []).append(c["latency_ms"])
    for api, values in sorted(by_api.items()):
        v = np.sort(np.asarray(values))
        # From 0 at the first sample, so that one sample still draws its step (a vertical line).
        ax.step(np.r_[v[0], v], np.r_[0.0, np.arange(1, v.size + 1) / v.size], where="post",
                marker="o" if v.size <= 20 else None, markersize=3, label=f"{api} (n={v.size})")
    ax.set_xscale("symlog", linthresh=1e-3)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of calls")
    ax.set_title("API latency CDF")
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3)
    save(fig, path)


# Variant-table columns: (summary key, heading, format); a column appears when a variant has it.
_VARIANT_COLUMNS = (
    ("resize_p50_ms", "resize host time p50 (ms)", lambda v: _fmt(v)),
    ("resize_copies_done_p50_ms", "copies done p50 (ms)", lambda v: _fmt(v)),
    ("resize_copy_gbps", "copy GB/s", lambda v: _fmt(v, 2)),
    ("copy_paths", "copy path", lambda v: ", ".join(v)),
    ("copy_ctas", "CTAs", lambda v: ", ".join(map(str, v))),
    ("probe_p50_ms", "probe p50 (ms)", lambda v: _fmt(v)),
    ("probe_p99_ms", "probe p99 (ms)", lambda v: _fmt(v)),
    ("longest_writer_wait_ms", "longest writer wait (ms)", lambda v: _fmt(v)),
    ("offloaded_pages", "offloaded pages", str),
    ("failed_calls", "failed calls", str),
    ("violations", "violations", str),
    ("deadlocks", "deadlocks", str),
    ("starved", "writer starved", lambda v: "yes" if v else "no"),
)


def _variant_order(results: dict) -> list[str]:
    """The variants in the order the run made them (results.json sorts its keys)."""
    variants = results.get("variants") or {}
    order = [n for n in results.get("variant_order", []) if n in variants]
    return order + sorted(set(variants) - set(order))


def _variants_section(results: dict) -> list[str]:
    variants = results.get("variants")
    if not variants:
        return []
    names = _variant_order(results)
    metrics = sorted({m for v in variants.values() for m in v.get("reference", {}).get("metrics", {})})
    columns = [c for c in _VARIANT_COLUMNS
               if any(variants[n].get(c[0]) is not None for n in names)
               and (c[0] != "longest_writer_wait_ms" or any(variants[n].get(c[0]) for n in names))]
    lines = ["## Variants", ""]
    head = "| variant | " + " | ".join(c[1] for c in columns) + " |"
    sep = "|---|" + "---|" * len(columns)
    for m in metrics:
        head += f" {m}: reference | error |"
        sep += "---|---|"
    lines += [head, sep]
    for name in names:
        v = variants[name]
        row = f"| {name} | " + " | ".join(
            "-" if v.get(key) is None else fmt(v[key]) for key, _, fmt in columns) + " |"
        for m in metrics:
            ref = v.get("reference", {}).get("metrics", {}).get(m)
            if ref is None:
                row += " - | - |"
            else:
                err = ref["error_pct"]
                row += f" {_fmt(ref['reference'])} | {'-' if err is None else f'{err:+.2f} %'} |"
        lines.append(row)
    sources = sorted({v["reference"]["source"] for v in variants.values() if "reference" in v})
    if sources:
        lines += ["", "Reference figures: " + "; ".join(sources)]
    lines.append("")
    return lines


def _variants_figure(results: dict, path: Path) -> bool:
    """Host time and copies-done time of the growth resize per variant (horizontal bars, the
    run's order); False when no variant has them."""
    names = [n for n in _variant_order(results)
             if results["variants"][n].get("resize_copies_done_p50_ms") is not None]
    if not names:
        return False
    v = results["variants"]
    fig, ax = new_figure(8.0, 1.2 + 0.32 * len(names))
    y = np.arange(len(names))
    done = [v[n]["resize_copies_done_p50_ms"] for n in names]
    host = [v[n].get("resize_p50_ms") or 0.0 for n in names]
    ax.barh(y, done, height=0.7, color="#9dc3e6", label="copies done (offloads landed)")
    ax.barh(y, host, height=0.35, color="#2f5597", label="resize host time (lock held)")
    for yi, d in zip(y, done):
        ax.text(d, yi, f" {d:.2f}", va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time from the resize call (ms, p50)")
    ax.set_xlim(0, max(done) * 1.15)
    ax.set_title("Growth resize per variant")
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3, axis="x")
    save(fig, path)
    return True


def _range(values: list[tuple[float, str]], unit: str = "ms", digits: int = 3) -> str:
    """``x unit`` when all agree, else ``lo (name) to hi (name)``."""
    lo, hi = min(values), max(values)
    if abs(hi[0] - lo[0]) <= 1e-9 * max(abs(hi[0]), 1.0):
        return f"{lo[0]:.{digits}f} {unit}"
    return f"{lo[0]:.{digits}f} {unit} ({lo[1]}) to {hi[0]:.{digits}f} {unit} ({hi[1]})"


def _answer(results: dict) -> str:
    """The report's first paragraph: the key figures of the run (and across its variants)."""
    from kvsim.scenario.results import variant_summary

    runs = {"the base run": variant_summary(results, None)}
    for name in _variant_order(results):
        runs[name] = results["variants"][name]
    parts = []
    resize = [(v["resize_p50_ms"], n) for n, v in runs.items() if v.get("resize_p50_ms") is not None]
    if resize:
        parts.append("The growth resize holds the manager for " + _range(resize) + " of host time")
    done = [(v["resize_copies_done_p50_ms"], n) for n, v in runs.items()
            if v.get("resize_copies_done_p50_ms") is not None]
    if done:
        best, worst = min(done), max(done)
        how = runs[best[1]]
        path = ", ".join(how.get("copy_paths") or []) or "?"
        ctas = f" with {', '.join(map(str, how['copy_ctas']))} CTAs" if how.get("copy_ctas") else ""
        gbps = how.get("resize_copy_gbps")
        parts.append(f"its offloads have landed after {_range(done)}; the fastest, {best[1]}, "
                     f"moves them by {path}{ctas}"
                     + (f" at {gbps:.1f} GB/s" if gbps else "")
                     + (f", {worst[0] / best[0]:.1f}x sooner than the slowest" if worst[0] > best[0]
                        else ""))
    if "probe" in results:
        p50 = [(v["probe_p50_ms"], n) for n, v in runs.items() if v.get("probe_p50_ms") is not None]
        p99 = [(v["probe_p99_ms"], n) for n, v in runs.items() if v.get("probe_p99_ms") is not None]
        if p50:
            parts.append(f"probe latency p50 {_range(p50)}, p99 {_range(p99)}")
    waits = [(v["longest_writer_wait_ms"], n) for n, v in runs.items()
             if v.get("longest_writer_wait_ms") is not None]
    if any(w for w, _ in waits):
        parts.append(f"the longest writer wait is {_range(waits)}")
    dead = [n for n, v in runs.items() if v.get("deadlocks")]
    parts.append(f"{len(dead)} of {len(runs)} runs deadlock or hit a lock hazard"
                 + (f" ({', '.join(dead)})" if dead else ""))
    failed = [(v["failed_calls"], n) for n, v in runs.items() if v.get("failed_calls")]
    parts.append(f"{sum(f for f, _ in failed)} calls fail"
                 + (f" ({', '.join(f'{n}: {f}' for f, n in failed)})" if failed else ""))
    if results["executor"] == "plan":
        parts.insert(0, f"{results['offload']['pages']} pages offloaded and "
                        f"{results['onboard']['pages']} onboarded (the plan executor: counts, "
                        "no time)")
    refs = [(n, m, r) for n, v in runs.items()
            for m, r in v.get("reference", {}).get("metrics", {}).items()
            if r.get("error_pct") is not None]
    growth_failed = [c for c in results["calls"] if c["phase"] == "growth" and not c["ok"]]
    if growth_failed:  # first: every figure above describes a run whose growth did not happen
        parts.insert(0, f"the growth resize FAILED in the base run ({len(growth_failed)} of its "
                        f"calls; first: {growth_failed[0].get('error') or 'returned False'})")
    text = "; ".join(parts) + "."
    if refs:
        text += " Against the reference figures: " + "; ".join(
            f"{n} {m} {r['predicted']:.3f} vs {r['reference']:.3f} ({r['error_pct']:+.1f} %)"
            for n, m, r in refs) + "."
    return text[0].upper() + text[1:]


def _api_section(results: dict) -> list[str]:
    lines = ["## API calls", "", "| API | count | failed | p50 ms | p90 ms | p99 ms | max ms | "
             "lock wait p50 ms | lock wait max ms |", "|---|---|---|---|---|---|---|---|---|"]
    for api, row in results["api"].items():
        lat, wait = row.get("latency", {}), row.get("lock_wait", {})
        lines.append(f"| `{api}` | {row['count']} | {row['failed']} | {_fmt(lat.get('p50_ms'))} | "
                     f"{_fmt(lat.get('p90_ms'))} | {_fmt(lat.get('p99_ms'))} | "
                     f"{_fmt(lat.get('max_ms'))} | {_fmt(wait.get('p50_ms'))} | "
                     f"{_fmt(wait.get('max_ms'))} |")
    return lines + [""]


def write_report(results: dict, out_dir: Path) -> None:
    sc = results["scenario"]
    sim = results["executor"] in ("sim", "hw")  # both have times, a lock and a link
    variant = results.get("variant")
    title = f"# {sc['name']}" + (f", variant {variant['name']}" if variant else "")
    lines = [title, ""]
    if variant:
        sets = ", ".join(f"`{k}={v}`" for k, v in variant["set"].items()) or "nothing"
        lines += [f"Variant `{variant['name']}` of `{variant['of']}`: sets {sets}.", ""]
    if sc.get("question"):
        lines += [f"**Question.** {sc['question'].strip()}", ""]
    answer = serving_answer(results) if is_serving(results) else _answer(results)
    lines += [f"**Answer.** {answer}", "",
              sc["description"].strip() or "(no description)", ""]
    if results.get("overrides"):
        lines += ["* overrides (`--set`): " + ", ".join(f"`{o}`" for o in results["overrides"])]
    lines += [
        f"* scenario file: `{sc['file']}`, seed {sc['seed']}, executor `{results['executor']}`"
        + (f", hardware `{results['hardware']}`" if sim else "")
        + (f", CPU cost model `{results['cpu_model']}`" if "cpu_model" in results else "")
        + (f", copier `{results['hw']['copier']}`, verify {results['hw']['verify']}"
           if "hw" in results else ""),
        f"* pages offloaded: {results['offload']['pages']} ({results['offload']['bytes']:,} bytes); "
        f"by the growth phase: {results['offload']['growth_pages']} "
        f"({results['offload']['growth_bytes']:,} bytes)",
        f"* pages onboarded: {results['onboard']['pages']}",
        *_reuse_line(results.get("reuse")),
        f"* invariant violations: {len(results['violations'])}; deadlocks and lock hazards: "
        f"{len(results['deadlocks'])}" + (" (the base run; the variants' are in their table)"
                                          if results.get("variants") else ""),
        "",
    ]
    if is_serving(results):
        lines += serving_section(results, out_dir)
    lines += _variants_section(results)
    if results.get("variants") and _variants_figure(results, out_dir / "variants.png"):
        lines += ["![growth resize per variant](variants.png)", ""]
    if results.get("variants"):
        lines += ["Each variant's own report: " + ", ".join(
            f"[{name}](variants/{name}/report.md)" for name in _variant_order(results)), ""]
    if sim:
        _timeline_figure(results, out_dir / "timeline.png")
        _latency_cdf_figure(results, out_dir / "latency_cdf.png")
        lines += _api_section(results)
        lock = results["lock"]
        if lock.get("starvation"):
            st = lock["starvation"]
            lines += [f"Longest writer wait ({lock['policy']}-preferring lock): "
                      f"{st['longest_writer_wait_ms']:.3f} ms by `{st['api']}` on {st['thread']}, "
                      f"while {st['readers_entered_while_waiting']} reader acquisitions entered.", ""]
        if "probe" in results:
            during = results["probe"]["during_exclusive_hold"]
            outside = results["probe"]["outside_exclusive_hold"]
            lines += ["Probe latency overlapping an exclusive hold: "
                      f"{during.get('count', 0)} probes, p50 {_fmt(during.get('p50_ms'))} ms, "
                      f"p99 {_fmt(during.get('p99_ms'))} ms; outside: {outside.get('count', 0)} "
                      f"probes, p50 {_fmt(outside.get('p50_ms'))} ms.", ""]
        link = results["link"]
        lines += [f"Link: {link['bytes']['offload']:,} bytes offloaded, {link['bytes']['onboard']:,} "
                  f"onboarded; mean rate while busy {link['mean_busy_gbps']['offload']:.2f} / "
                  f"{link['mean_busy_gbps']['onboard']:.2f} GB/s.", "",
                  "## Timeline", "", "![timeline](timeline.png)", "",
                  "## Latency", "", "![latency CDF](latency_cdf.png)", ""]
        if results["deadlocks"]:
            lines += ["## Deadlocks and lock hazards", ""]
            for d in results["deadlocks"]:
                if d["kind"] == "deadlock":
                    lines.append(f"* deadlock at {d['time'] * 1e3:.4f} ms, a cycle of "
                                 f"{len(d['cycle'])} threads:")
                    lines += [f"  * `{t['thread']}` in `{t['api']}` holds "
                              f"{', '.join(t['holds']) or 'nothing'} and waits for {t['waits_for']}"
                              for t in d["cycle"]]
                elif d["kind"] == "stuck":
                    lines.append("* stuck threads (no event left): " + "; ".join(
                        f"`{t['thread']}` waits for {t['waits_for']}" for t in d["threads"]))
                else:
                    lines.append(f"* lock hazard `{d['kind']}`: {d['thread']} in `{d['api']}`")
            lines.append("")
    else:
        _occupancy_figure(results, out_dir / "occupancy.png")
        _migration_figure(results, out_dir / "migrations.png")
        lines += ["## Calls", "", "| # | thread | phase | API | ok | offloaded | onboarded | dropped "
                  "| copy batches |", "|---|---|---|---|---|---|---|---|---|"]
        for c in results["calls"][:MAX_CALL_ROWS]:
            lines.append(f"| {c['index']} | {c['thread']} | {c['phase']} | `{c['api']}` | "
                         f"{'yes' if c['ok'] else 'NO'} | {c['offloaded_pages']} | "
                         f"{c['onboarded_pages']} | {c['dropped_pages']} | {c['copy_batches']} |")
        if len(results["calls"]) > MAX_CALL_ROWS:
            lines.append(f"| ... | {len(results['calls']) - MAX_CALL_ROWS} more in calls.csv |")
        lines += ["", "## Tier occupancy", "", "![occupancy](occupancy.png)", "",
                  "## Migrations", "", "![migrations](migrations.png)", ""]
    if results["violations"]:
        lines += ["## Violations (lock discipline and invariants)", ""]
        lines += [f"* call {v['index']} `{v['api']}`: {v['problem']}" for v in results["violations"][:50]]
        lines.append("")
    (out_dir / "report.md").write_text("\n".join(lines))


def _reuse_line(reuse: dict | None) -> list[str]:
    """Blocks reused and missed (KVCM2's definitions), and where the reused ones were found."""
    if not reuse or not (reuse["reused_blocks"] or reuse["missed_blocks"]):
        return []
    rate = reuse["hit_rate"]
    levels = ", ".join(f"{name} {n}" for name, n in reuse.get("reused_blocks_by_level", {}).items())
    return [f"* blocks reused: {reuse['reused_blocks']:,}, missed: {reuse['missed_blocks']:,} "
            f"(hit rate {rate:.1%}); reused blocks found on: {levels}"]
