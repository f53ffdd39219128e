"""Do the shipped scenarios still give the same results? Byte for byte, base run and variants.

    python tools/check_results_unchanged.py save DIR    # write every scenario's results into DIR
    python tools/check_results_unchanged.py check DIR   # run again; list what differs from DIR

Runs every scenario file under ``scenarios/`` that the simulator or the plan executor runs
(hardware-executor scenarios need a GPU and are timed by the wall clock, so they are skipped;
sweep files are sweeps, not scenarios). For each it stores ``results.json`` exactly as
``kvsim run`` writes it, and each variant's. ``check`` exits 1 if any file differs or is missing.
Meant for refactors that must not change behaviour: save before, check after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def scenario_files() -> list[Path]:
    from kvsim.scenario.load import shipped_scenario_files

    return shipped_scenario_files(REPO)


def results_of(path: Path) -> dict[str, str]:
    """``{relative file name: content}`` of a run's results (base and variants)."""
    from kvsim.scenario.load import load_scenario_file
    from kvsim.scenario.results import results_json
    from kvsim.scenario.run import run_scenario

    results = run_scenario(load_scenario_file(path.relative_to(REPO)))
    files = {"results.json": results_json(results)}
    for name, v in results.get("_variant_results", {}).items():
        files[f"variants/{name}/results.json"] = results_json(v)
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("save", "check"))
    p.add_argument("dir", help="where the reference results are (or go)")
    args = p.parse_args(argv)
    root = Path(args.dir).resolve()
    os.chdir(REPO)  # scenarios load by relative path, as in the README (results name the file)
    differ = 0
    for path in scenario_files():
        rel = path.relative_to(REPO / "scenarios").with_suffix("")
        t0 = time.perf_counter()
        files = results_of(path)
        for name, text in files.items():
            ref = root / rel / name
            if args.action == "save":
                ref.parent.mkdir(parents=True, exist_ok=True)
                ref.write_text(text)
                continue
            if not ref.exists():
                print(f"MISSING   {rel}/{name}")
                differ += 1
            elif ref.read_text() != text:
                print(f"DIFFERS   {rel}/{name}")
                differ += 1
        if args.action == "check":
            extra = {str(p.relative_to(root / rel)) for p in (root / rel).rglob("results.json")}
            for name in sorted(extra - set(files)):
                print(f"GONE      {rel}/{name}")
                differ += 1
        print(f"{'saved' if args.action == 'save' else 'checked'} {rel} ({len(files)} files, "
              f"{time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    if args.action == "check":
        print(f"{differ} file(s) differ" if differ else "all results byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
