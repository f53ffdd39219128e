"""Two commits' benchmark figures, measured at the same time: is a change faster, on a noisy host?

    python tools/side_by_side.py BASE NEW [--rounds N] -- COMMAND...

``COMMAND`` is a kvsim benchmark that prints one JSON line (``python -m kvsim.bench.replay
--timed-only --json``, ``python -m kvsim bench sim-scenarios --json``, ...). Each commit's
``kvsim``, ``data`` and ``scenarios`` are copied out of git (``git archive``) into a temporary
directory; in each round the command runs from both copies **at once**, one process each, with
``PYTHONPATH`` set to the copy and ``{root}`` in the command replaced by it. Prints each round's
figures and their ratio (new over base), then the median ratio; ``--json`` prints them as one
JSON line.

Why at once: the 2-core development VM's speed moves by 20-30 % within minutes (and by 2x
between sessions), so runs made one after another compare the host's minutes as much as the
code. Two processes that run together share those minutes; each has a core of its own, so
neither waits for the other (run nothing else meanwhile). They still share the memory
bandwidth and the last-level cache: for a benchmark of a few milliseconds
(``kvsim bench burst-resize``), on 2026-12-06, identical code measured 0.90-1.30 apart this way;
there, take the minimum of many runs one after another instead. A figure that depends on the
cores being idle (wall time of a multi-process command) is not for this tool either.

The figure compared is ``--key`` of the JSON line (default ``cpu_s``, then ``wall_s`` when the
line has no ``cpu_s``); ``peak_rss_mib`` and ``calls_digest`` are shown when present.

``--instructions`` compares instructions instead of seconds: each run goes through valgrind's
cachegrind (``--cache-sim=no``: it counts the instructions executed, ``I refs``, about 20x
slower than a plain run), with ``PYTHONHASHSEED=0``. The count does not move with the host's
speed: on 2026-12-07, the same code measured 1.0000 and 1.0005 apart (800 requests of the timed
replay), where seconds moved by 10-15 %; one round is enough. It misses what instructions do
not show (cache misses, memory bandwidth): a change that moves data rather than instructions
needs seconds, or cachegrind's cache model (``--cache-sim=yes``, by hand). The whole timed
replay took 7-9 minutes a side (both at once) on 2026-12-07; ``--max-requests`` shortens it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("kvsim", "data", "scenarios")  # what a benchmark reads from the tree


def export(commit: str, into: Path) -> Path:
    """``commit``'s copied folders under ``into`` (exits if git cannot archive the commit)."""
    into.mkdir(parents=True)
    got = subprocess.run(["git", "-C", str(ROOT), "archive", commit, *COPIED], capture_output=True)
    if got.returncode != 0:
        raise SystemExit(f"git cannot archive {commit!r}: {got.stderr.decode().strip()}")
    archive = got.stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


# counts the instructions a process executes, and nothing else (see the module docstring)
CACHEGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def start(root: Path, command: list[str], instructions: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(root))
    args = [a.replace("{root}", str(root)) for a in command]
    if instructions:
        env["PYTHONHASHSEED"] = "0"
        args = CACHEGRIND + args
    # From the copy's parent, so that the working directory holds no other kvsim.
    return subprocess.Popen(args, cwd=root.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def figures(proc: subprocess.Popen, label: str) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{label}: the command failed (exit {proc.returncode}):\n{err[-2000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{label}: the command printed no JSON line:\n{out[-2000:]}")
    fig = json.loads(lines[-1])
    counted = instructions_counted(err)
    if counted is not None:
        fig["instructions"] = counted
    return fig


def instructions_counted(stderr: str) -> int | None:
    """The ``I refs`` total cachegrind prints at exit (``==123== I   refs:  1,234``), or None."""
    found = re.search(r"^==\d+== I\s+refs:\s+([\d,]+)\s*$", stderr, re.MULTILINE)
    return None if found is None else int(found.group(1).replace(",", ""))


def value(fig: dict, key: str | None) -> float:
    if key is not None:
        return float(fig[key])
    return float(fig["cpu_s"] if "cpu_s" in fig else fig["wall_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the commit measured first in each pair (the reference)")
    parser.add_argument("new", help="the commit compared with it")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (default 3)")
    parser.add_argument("--key", help="the JSON figure compared (default cpu_s, else wall_s)")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    parser.add_argument("--instructions", action="store_true",
                        help="compare instructions executed (valgrind's cachegrind), not seconds")
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        parser.error("give the benchmark command after --")
    cut = argv.index("--")
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if not command:
        parser.error("give the benchmark command after --")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.instructions:
        if shutil.which("valgrind") is None:
            parser.error("--instructions needs valgrind on the PATH (apt install valgrind)")
        if args.key not in (None, "instructions"):
            parser.error("--instructions compares instructions: leave --key out")
        args.key = "instructions"
    rows = []
    # instructions: whole counts, and ratios to 4 digits (differences of 0.1 % are real)
    shown, digits = (",.0f", 4) if args.instructions else (".3f", 3)
    with tempfile.TemporaryDirectory(prefix="kvsim-side-by-side-") as tmp:
        roots = {name: export(commit, Path(tmp) / name / "tree")
                 for name, commit in (("base", args.base), ("new", args.new))}
        for r in range(1, args.rounds + 1):
            procs = {name: start(root, command, args.instructions) for name, root in roots.items()}
            fig = {name: figures(proc, f"{name} ({getattr(args, name)}), round {r}")
                   for name, proc in procs.items()}
            row = {"round": r, "ratio": value(fig["new"], args.key) / value(fig["base"], args.key)}
            for name in ("base", "new"):
                row[name] = {k: fig[name][k] for k in ("cpu_s", "wall_s", "peak_rss_mib",
                                                        "calls_digest") if k in fig[name]}
                if args.key:
                    row[name][args.key] = fig[name][args.key]
            rows.append(row)
            if not args.json:
                print(f"round {r}: " + "; ".join(
                    f"{name} {value(fig[name], args.key):{shown}}"
                    + (f" ({fig[name]['peak_rss_mib']:.1f} MiB)" if "peak_rss_mib" in fig[name] else "")
                    + (f" digest {fig[name]['calls_digest'][:8]}" if "calls_digest" in fig[name] else "")
                    for name in ("base", "new")) + f"; new/base {row['ratio']:.{digits}f}", flush=True)
    median = statistics.median(r["ratio"] for r in rows)
    if args.json:
        print(json.dumps({"base": args.base, "new": args.new, "command": command, "rounds": rows,
                          "median_ratio": median}, sort_keys=True))
    else:
        print(f"median new/base over {len(rows)} rounds: {median:.{digits}f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
