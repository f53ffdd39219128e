"""Running a sweep: points, resume, backend, table, report.

Output directory (default ``reports/sweeps/<scenario name>/``): ``results.parquet`` and
``results.csv`` (the table, :mod:`kvsim.sweep.table`), ``sweep.json`` (the definition that made
it), and ``report.md`` with its figures (:mod:`kvsim.sweep.report`).

A re-run into the same directory skips the points already there with status ``ok`` and runs
the others, failed ones included. Same point id means the same inputs: the scenario's content and
the files it and the parameters name (a trace, a preset kept elsewhere), the parameters, fixed
overrides and seed, and the same kvsim, its code and shipped presets
(:func:`kvsim.sweep.points.point_id`). The table then holds this sweep's points only; rows of
earlier runs whose points are not in this sweep are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.output_dir import open_output_dir
from kvsim.sweep.backends import run_tasks
from kvsim.sweep.points import Point, failed_row, sweep_points
from kvsim.sweep.spec import Sweep
from kvsim.sweep.table import Journal, build_table, previous_rows, write_table


@dataclass
class SweepOutcome:
    out_dir: Path
    table: Any                      # pandas.DataFrame
    points: int
    ran: int
    skipped: int                    # finished in an earlier run
    failed: int                     # rows with status error
    dropped: int = 0                # earlier rows not in this sweep
    report: Path | None = None
    errors: list[str] = field(default_factory=list)


def default_out_dir(sweep: Sweep) -> Path:
    return Path("reports") / "sweeps" / sweep.name


def param_keys(sweep: Sweep) -> list[str]:
    keys: list[str] = []
    for part in sweep.parts:
        keys += [k for k, _ in part.params if k not in keys]
    return keys


def run_sweep(sweep: Sweep, out_dir: str | Path | None = None, backend: str = "local",
              workers: int | None = None, scheduler: str | None = None,
              progress: Callable[[str], None] | None = None, report: bool = True,
              latency_target_ms: float | None = None) -> SweepOutcome:
    say = progress or (lambda m: None)
    out = open_output_dir(Path(out_dir) if out_dir is not None else default_out_dir(sweep),
                          "--out" if out_dir is not None else "the sweep directory")
    points: list[Point] = sweep_points(sweep)
    ids = {p.point_id for p in points}
    earlier = previous_rows(out)
    rows = {pid: r for pid, r in earlier.items() if pid in ids and r.get("status") == "ok"}
    dropped = sum(1 for pid in earlier if pid not in ids)
    todo = [p for p in points if p.point_id not in rows]
    say(f"{sweep.name}: {len(points)} points ({len(rows)} already done, {len(todo)} to run) "
        f"on the {backend} backend" + (f"; {dropped} earlier rows not in this sweep dropped"
                                       if dropped else ""))
    (out / "sweep.json").write_text(json.dumps(sweep.to_dict(), indent=1, default=str) + "\n")
    journal = Journal(out)
    count = [0]

    def on_row(row: dict) -> None:
        rows[row["point_id"]] = row
        journal.append(row)
        count[0] += 1
        say(f"done {count[0]}/{len(todo)} ({row['point_id']} {row['status']}"
            + (f": {row['error']}" if row["status"] != "ok" else "") + ")")

    try:
        run_tasks([p.task() for p in todo], on_row, backend, workers, scheduler)
    finally:
        journal.close()
    for p in todo:  # a point the backend never answered (should not happen): recorded failed
        if p.point_id not in rows:
            rows[p.point_id] = failed_row(p.task(), RuntimeError("no result from the backend"))
    table = build_table([rows[p.point_id] for p in points], param_keys(sweep))
    write_table(table, out)
    journal.close(remove=True)
    failed = int((table["status"] != "ok").sum())
    outcome = SweepOutcome(out, table, len(points), len(todo), len(points) - len(todo), failed,
                           dropped, errors=[r["error"] for r in rows.values()
                                            if r["point_id"] in ids and r["status"] != "ok"])
    if report:
        from kvsim.sweep.report import write_sweep_report

        outcome.report = write_sweep_report(table, out, latency_target_ms=latency_target_ms,
                                            sweep=sweep.to_dict())
    return outcome
