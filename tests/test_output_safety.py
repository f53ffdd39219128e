"""Output directories through the real CLI: kvsim never deletes or replaces what it did not write.

Each test works in a temporary workspace holding a user's files (the scenario, a notes file, a
foreign directory), runs ``kvsim`` there, and asserts that everything outside the output
directory is byte-for-byte as it was.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import tree_snapshot as snapshot

import kvsim.output_dir as output_dir
from kvsim.cli import main
from kvsim.output_dir import MARKER

REPO = Path(__file__).resolve().parents[1]
SAMPLE_TRACE = REPO / "scenarios" / "traces" / "mooncake_sample.jsonl"

SCENARIO = """\
name: {name}
manager:
  tokens_per_block: 4
  layers:
    - slot_bytes: [1 KiB, 1 KiB]
  levels:
    - {{name: gpu, quota_bytes: 64 KiB}}
    - {{name: host, quota_bytes: 256 KiB}}
workload:
  kind: burst_resize
  history_tokens: 40
  filler_requests: 2
"""


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A user's directory: a scenario, a notes file and a foreign folder; it is the cwd, and
    HOME is a folder beside it."""
    ws = tmp_path / "work"
    ws.mkdir()
    (ws / "s.yaml").write_text(SCENARIO.format(name="tiny"))
    (ws / "notes.txt").write_text("my notes\n")
    (ws / "mine").mkdir()
    (ws / "mine" / "data.csv").write_text("1,2,3\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "keep.txt").write_text("keep\n")
    monkeypatch.setenv("HOME", str(home))
    # matplotlib's first import in a process writes its font cache under HOME: keep it out of
    # the snapshots, which would otherwise see it when this file runs on its own
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path.parent / f"{tmp_path.name}-mpl"))
    monkeypatch.chdir(ws)
    return ws


def _refused(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", ".hidden", "x" * 101, ""])
def test_scenario_name_must_be_one_safe_path_component(workspace, capsys, name):
    (workspace / "bad.yaml").write_text(SCENARIO.format(name=repr(name)))
    before = snapshot(workspace.parent)
    assert main(["run", "bad.yaml"]) == 2
    _refused(capsys, "bad.yaml:1: name:")
    assert snapshot(workspace.parent) == before


@pytest.mark.parametrize("out, why", [
    (".", "is the current directory"),
    ("..", "contains the current directory"),
    ("mine", "was not written by kvsim"),
    ("notes.txt", "is not a directory"),
    ("notes.txt/sub", "is a file, not a directory"),
    ("/", "is the filesystem root"),
])
def test_run_refuses_an_output_it_did_not_write(workspace, capsys, out, why):
    before = snapshot(workspace.parent)
    assert main(["run", "s.yaml", "--out", out]) == 2
    _refused(capsys, f"--out {out}", why)
    assert snapshot(workspace.parent) == before


def test_run_refuses_the_home_directory_and_its_parents(workspace, capsys):
    home = Path(os.environ["HOME"])
    before = snapshot(workspace.parent)
    for out, why in ((home, "is the home directory"), (home.parent, "contains the")):
        assert main(["run", "s.yaml", "--out", str(out)]) == 2
        _refused(capsys, why)
    assert snapshot(workspace.parent) == before


def test_run_refuses_a_symbolic_link(workspace, capsys):
    (workspace / "link").symlink_to(workspace / "mine")
    before = snapshot(workspace.parent)
    assert main(["run", "s.yaml", "--out", "link"]) == 2
    _refused(capsys, "is a symbolic link")
    assert snapshot(workspace.parent) == before


def test_read_only_output_is_refused_before_the_run(workspace, capsys, monkeypatch):
    import kvsim.scenario.run as run  # kvsim run imports it from there when it runs

    def must_not_run(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr(run, "run_scenario", must_not_run)
    locked = workspace / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = snapshot(workspace.parent)
        assert main(["run", "s.yaml", "--out", "locked/out"]) == 2
        _refused(capsys, "--out locked/out", "read-only")
        assert main(["run", "s.yaml", "--out", "locked"]) == 2
        _refused(capsys, "--out locked")
        assert snapshot(workspace.parent) == before
    finally:
        locked.chmod(stat.S_IRWXU)


def test_new_empty_and_kvsim_directories_are_written(workspace, capsys):
    assert main(["run", "s.yaml", "--out", "new/deep/out", "--quiet"]) == 0
    assert (workspace / "new/deep/out" / MARKER).is_file()
    (workspace / "empty").mkdir()
    assert main(["run", "s.yaml", "--out", "empty", "--quiet"]) == 0
    assert (workspace / "empty/results.json").is_file()
    # a kvsim output is replaced whole: a file left in it by hand goes with it
    (workspace / "empty" / "stale.txt").write_text("x")
    before = snapshot(workspace.parent, skip=workspace / "empty")
    assert main(["run", "s.yaml", "--out", "empty", "--quiet"]) == 0
    assert not (workspace / "empty/stale.txt").exists()
    assert (workspace / "empty/results.json").is_file()
    assert snapshot(workspace.parent, skip=workspace / "empty") == before
    assert [p.name for p in workspace.iterdir() if p.name.startswith(".")] == []


def test_default_report_directory_is_under_reports(workspace, capsys):
    (workspace / "reports").mkdir()
    (workspace / "reports" / "other").mkdir()
    (workspace / "reports" / "other" / "x.md").write_text("someone else's report\n")
    before = snapshot(workspace.parent, skip=workspace / "reports" / "tiny")
    assert main(["run", "s.yaml", "--quiet"]) == 0
    assert (workspace / "reports/tiny/report.md").is_file()
    assert snapshot(workspace.parent, skip=workspace / "reports" / "tiny") == before


def test_failed_run_leaves_the_previous_report_as_it_was(workspace, capsys, monkeypatch):
    import kvsim.scenario.run as run  # kvsim run imports it from there when it runs

    assert main(["run", "s.yaml", "--out", "out", "--quiet"]) == 0
    before = snapshot(workspace.parent)

    def broken(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_scenario", broken)
    with pytest.raises(KeyboardInterrupt):
        main(["run", "s.yaml", "--out", "out", "--quiet"])
    assert snapshot(workspace.parent) == before  # no staging directory left either


def test_interrupted_replacement_leaves_one_complete_report(workspace, capsys, monkeypatch):
    """An interrupt between moving the old report aside and moving the new one in leaves the
    old one complete beside the output; the next run puts it back before it starts, then
    replaces it."""
    assert main(["run", "s.yaml", "--out", "out", "--quiet"]) == 0
    old = snapshot(workspace / "out")
    calls = []
    real_replace = os.replace

    def interrupted(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the new report moving in
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(output_dir.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["run", "s.yaml", "--out", "out", "--quiet"])
    monkeypatch.setattr(output_dir.os, "replace", real_replace)
    aside = [p for p in workspace.iterdir() if p.name.startswith(".out.kvsim-old-")]
    assert len(aside) == 1 and snapshot(aside[0]) == old  # the old report, complete
    assert not (workspace / "out").exists()
    # the next write restores it first; a failing run then leaves it in place
    import kvsim.scenario.run as run  # kvsim run imports it from there when it runs

    real_run = run.run_scenario
    monkeypatch.setattr(run, "run_scenario", lambda *a, **k: (_ for _ in ()).throw(RuntimeError))
    with pytest.raises(RuntimeError):
        main(["run", "s.yaml", "--out", "out", "--quiet"])
    assert snapshot(workspace / "out") == old
    assert [p.name for p in workspace.iterdir() if p.name.startswith(".out")] == []
    monkeypatch.setattr(run, "run_scenario", real_run)
    assert main(["run", "s.yaml", "--out", "out", "--quiet"]) == 0
    assert [p.name for p in workspace.iterdir() if p.name.startswith(".out")] == []


@pytest.mark.parametrize("out", [".", "..", "mine"])
def test_replay_cache_refuses_foreign_outputs(workspace, capsys, out):
    before = snapshot(workspace.parent)
    assert main(["replay-cache", str(SAMPLE_TRACE), "--capacity-tokens", "10k,20k",
                 "--out", out, "--quiet"]) == 2
    _refused(capsys, f"--out {out}")
    assert snapshot(workspace.parent) == before


def test_replay_cache_replaces_its_own_output(workspace, capsys):
    for _ in range(2):
        assert main(["replay-cache", str(SAMPLE_TRACE), "--capacity-tokens", "10k,20k",
                     "--out", "curve", "--quiet", "--json"]) == 0
    assert sorted(p.name for p in (workspace / "curve").iterdir()) == [
        MARKER, "hit_rate.png", "results.json"]


@pytest.mark.parametrize("argv", [
    ["sweep", "s.yaml", "--param", "seed=1,2", "--out", "mine"],
    ["sweep", "s.yaml", "--param", "seed=1,2", "--out", "."],
    ["validate", "s.yaml", "--measured", "mine", "--out", "mine"],
    ["calibrate", "--out", "."],
    ["calibrate", "--out", "mine"],
])
def test_commands_that_add_files_refuse_foreign_directories(workspace, capsys, argv):
    before = snapshot(workspace.parent)
    assert main(argv) == 2
    _refused(capsys, "--out")
    assert snapshot(workspace.parent) == before


def test_record_trace_never_overwrites_a_user_file(workspace, capsys):
    before = snapshot(workspace.parent)
    assert main(["run", "s.yaml", "--record-trace", "notes.txt", "--out", "o"]) == 2
    _refused(capsys, "--record-trace notes.txt", "not an op trace")
    assert main(["run", "s.yaml", "--record-trace", "mine", "--out", "o"]) == 2
    _refused(capsys, "is a directory")
    assert snapshot(workspace.parent) == before


def test_validate_replaces_only_its_own_copies_of_measured_runs(workspace, capsys):
    out = workspace / "judge"
    out.mkdir()
    (out / MARKER).write_text("")
    (out / "measured").mkdir()
    (out / "measured" / "mine").mkdir()
    (out / "measured" / "mine" / "precious.txt").write_text("x")
    before = snapshot(workspace.parent)
    assert main(["validate", "s.yaml", "--measured", "mine", "--out", "judge"]) == 2
    _refused(capsys, "was not written by kvsim")
    assert snapshot(workspace.parent) == before
    shutil.rmtree(out)
