"""tools/side_by_side.py: each commit's copy runs its own kvsim, and the ratio is new over base."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "side_by_side.py"

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout")

# Prints, as the figure, 1 when kvsim was imported from the tool's copy, else 2.
_WHERE = ("import json, kvsim; "
          "print(json.dumps({'wall_s': 1.0 if 'kvsim-side-by-side-' in kvsim.__file__ else 2.0}))")


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_each_side_runs_its_own_copy():
    done = _tool("HEAD", "HEAD", "--rounds", "2", "--json", "--", sys.executable, "-c", _WHERE)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["base"]["wall_s"] for r in out["rounds"]] == [1.0, 1.0]
    assert [r["new"]["wall_s"] for r in out["rounds"]] == [1.0, 1.0]
    assert out["median_ratio"] == 1.0


def test_a_missing_command_a_bad_commit_and_a_failing_command_are_clear_errors():
    done = _tool("HEAD", "HEAD")
    assert done.returncode == 2 and "give the benchmark command after --" in done.stderr
    done = _tool("no-such-commit", "HEAD", "--", "true")
    assert done.returncode == 1 and "git cannot archive 'no-such-commit'" in done.stderr
    done = _tool("HEAD", "HEAD", "--rounds", "1", "--", sys.executable, "-c", "raise SystemExit(3)")
    assert done.returncode == 1 and "the command failed (exit 3)" in done.stderr


def test_the_instruction_count_is_read_from_cachegrinds_summary():
    sys.path.insert(0, str(TOOL.parent))
    try:
        from side_by_side import instructions_counted
    finally:
        sys.path.remove(str(TOOL.parent))
    summary = ("==18799== \n==18799== I   refs:      4,321,684,927\n"
               "==18799== I1  misses:        1,234\n")
    assert instructions_counted(summary) == 4_321_684_927
    assert instructions_counted("Traceback ...\nI   refs: 12") is None  # not valgrind's line
    assert instructions_counted("") is None


@pytest.mark.skipif(__import__("shutil").which("valgrind") is None, reason="needs valgrind")
def test_instructions_compares_counts_under_cachegrind():
    # A loop of 400,000 steps on the new side only: tens of millions more instructions, where
    # two runs of the same code differ by well under 1 %.
    work = ("import json, kvsim; n = 400000 if '/new/tree/' in kvsim.__file__ else 0; "
            "sum(range(n)); print(json.dumps({'wall_s': 1.0}))")
    done = _tool("HEAD", "HEAD", "--rounds", "1", "--instructions", "--json", "--",
                 sys.executable, "-c", work)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)["rounds"][0]
    assert row["new"]["instructions"] > 1.1 * row["base"]["instructions"] > 0


def test_instructions_refuses_another_key():
    done = _tool("HEAD", "HEAD", "--instructions", "--key", "cpu_s", "--", "true")
    assert done.returncode == 2 and ("leave --key out" in done.stderr or "needs valgrind" in done.stderr)
