"""A run's results directory: ``results.json``, ``calls.csv``, ``trace.json`` (timed runs, base
and variants: :mod:`kvsim.report.perfetto`), each variant's results and the report with its
figures, written into a directory that replaces the previous one atomically
(:class:`kvsim.output_dir.ReplacedDir`)."""

from __future__ import annotations

from pathlib import Path

from kvsim.output_dir import ReplacedDir
from kvsim.report.perfetto import write_trace
from kvsim.report.scenario_report import write_report
from kvsim.scenario.results import calls_csv, results_json

TIMED = ("sim", "hw")  # the executors whose results have time (a trace); not "plan"


def write_results_into(results: dict, out_dir: Path) -> None:
    """Write results.json, calls.csv, trace.json, the variants and the report into ``out_dir``."""
    (out_dir / "results.json").write_text(results_json(results))
    (out_dir / "calls.csv").write_text(calls_csv(results))
    if results.get("executor") in TIMED:
        write_trace(results, out_dir / "trace.json")
    for name, v_results in results.get("_variant_results", {}).items():
        vdir = out_dir / "variants" / name
        vdir.mkdir(parents=True)
        (vdir / "results.json").write_text(results_json(v_results))
        if v_results.get("executor") in TIMED:
            write_trace(v_results, vdir / "trace.json")
        write_report(v_results, vdir)
    write_report(results, out_dir)


def write_results(results: dict, out_dir: Path) -> None:
    """Write the results directory ``out_dir``, replacing an earlier kvsim output atomically."""
    with ReplacedDir(out_dir) as staging:
        write_results_into(results, staging)
