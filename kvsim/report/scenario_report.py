"""The report of one scenario run: report.md plus figures, drawn from results.json alone."""

from __future__ import annotations

from pathlib import Path

from kvsim.report.figures import new_figure, save


def _occupancy_figure(results: dict, path: Path) -> None:
    calls = results["calls"]
    x = [c["index"] for c in calls]
    fig, ax = new_figure()
    for level, name in enumerate(results["levels"]):
        total = calls[0]["occupancy"][level]["total"] if calls else 0
        used = [c["occupancy"][level]["total"] - c["occupancy"][level]["free"] for c in calls]
        evictable = [c["occupancy"][level]["evictable"] for c in calls]
        frac = [u / total if total else 0.0 for u in used]
        line, = ax.plot(x, frac, marker="o", label=f"{name}: used / {total} slots")
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


def write_report(results: dict, out_dir: Path) -> None:
    _occupancy_figure(results, out_dir / "occupancy.png")
    _migration_figure(results, out_dir / "migrations.png")
    sc = results["scenario"]
    lines = [
        f"# {sc['name']}",
        "",
        sc["description"].strip() or "(no description)",
        "",
        f"* scenario file: `{sc['file']}`, seed {sc['seed']}, executor `{results['executor']}`",
        f"* pages offloaded: {results['offload']['pages']} "
        f"({results['offload']['bytes']:,} bytes); by the growth phase: "
        f"{results['offload']['growth_pages']} ({results['offload']['growth_bytes']:,} bytes)",
        f"* pages onboarded: {results['onboard']['pages']}",
        f"* invariant violations: {len(results['violations'])}",
        "",
        "## Calls",
        "",
        "| # | phase | API | cache | ok | allocated | offloaded | onboarded | dropped | "
        "copy batches | stats commits |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results["calls"]:
        lines.append(
            f"| {c['index']} | {c['phase']} | `{c['api']}` | {c['cache_id']} | "
            f"{'yes' if c['ok'] else 'NO'} | {c['allocated_pages']} | {c['offloaded_pages']} | "
            f"{c['onboarded_pages']} | {c['dropped_pages']} | {c['copy_batches']} | "
            f"{c['stats_commits']} |")
    lines += [
        "",
        "## Tier occupancy",
        "",
        "![occupancy](occupancy.png)",
        "",
        "## Migrations",
        "",
        "![migrations](migrations.png)",
        "",
    ]
    if results["violations"]:
        lines += ["## Invariant violations", ""]
        lines += [f"* call {v['index']} `{v['api']}`: {v['problem']}" for v in results["violations"]]
        lines.append("")
    (out_dir / "report.md").write_text("\n".join(lines))
