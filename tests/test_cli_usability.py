"""The command line's usability: --version, kvsim presets, sizes with units, each command's own
usage on its errors, help without reST markup, and kvsim bench sim-scenarios from anywhere.

Everything goes through the real command line: ``python -m kvsim.cli`` in a subprocess, or
:func:`kvsim.cli.main` with captured output.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.cli import build_parser, main
from kvsim.cli._common import plain, walk

REPO = Path(__file__).resolve().parents[1]
MARKUP = ("``", ":mod:", ":func:", ":class:", ":meth:", ":data:", ":attr:")


def kvsim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvsim.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def exits(argv: list[str]) -> int:
    """``main(argv)``'s exit status, whether it returns or argparse exits."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def pyproject_version() -> str:
    return re.search(r'(?m)^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)


# -- 1. --version ------------------------------------------------------------------------------
def test_version_prints_kvsim_and_the_installed_version():
    from importlib import metadata

    out = kvsim("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"kvsim {metadata.version('kvsim')}"


def test_version_falls_back_to_pyproject_when_not_installed(monkeypatch, capsys):
    from importlib import metadata

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert exits(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvsim {pyproject_version()}"


# -- 2. kvsim presets --------------------------------------------------------------------------
def preset_files() -> dict[tuple[str, str], dict]:
    files = {("hardware", p.stem): p for p in (REPO / "kvsim/hardware/presets").glob("*.json")}
    files |= {("cpu-cost", p.stem): p for p in (REPO / "kvsim/hardware/cpu").glob("*.json")}
    return {key: json.loads(p.read_text()) for key, p in files.items()}


def test_presets_prints_one_line_per_preset_with_description_and_sources():
    out = kvsim("presets")
    assert out.returncode == 0, out.stderr
    header, *lines = out.stdout.splitlines()
    assert header.split() == ["KIND", "NAME", "DESCRIPTION", "SOURCES"]
    presets = preset_files()
    assert len(lines) == len(presets) and len(presets) >= 7
    for (kind, name), data in presets.items():
        (line,) = [x for x in lines if x.split()[:2] == [kind, name]]
        first_words = " ".join(data["description"].split()[:4])
        assert first_words in line, (name, line)
    h200 = next(x for x in lines if x.split()[:2] == ["hardware", "h200-sxm"])
    assert "reports/measurements/h200/2026-12-02-copy-bench.json" in h200
    kvcm2 = next(x for x in lines if x.split()[:2] == ["cpu-cost", "kvcm2-cpp"])
    assert "seed PR #18541" in kvcm2


def test_presets_json_gives_full_descriptions_and_every_cited_document(capsys):
    assert main(["presets", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["presets"]
    presets = preset_files()
    assert {(r["kind"], r["name"]) for r in rows} == set(presets)
    for r in rows:
        data = presets[(r["kind"], r["name"])]
        assert r["description"] == data["description"]
        assert r["sources"] and all(s["document"] and s["figures"] >= 1 for s in r["sources"])
        assert sum(s["figures"] for s in r["sources"]) + r["unsourced_figures"] == r["figures"]
        for s in r["sources"]:  # every document is cited by the file itself
            assert s["document"] in json.dumps(data), (r["name"], s["document"])


def test_presets_kind_filter(capsys):
    assert main(["presets", "--kind", "cpu-cost", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["presets"]
    assert rows and {r["kind"] for r in rows} == {"cpu-cost"}


# -- 3. sizes with units -----------------------------------------------------------------------
COPY = ["copy-model", "--hardware", "h200-sxm", "--path", "kernel", "--pages", "100", "--json"]


def test_copy_model_sizes_accept_units_like_scenario_files(capsys):
    assert main([*COPY, "--page-bytes", "16384", "--inflight-bytes", "32768"]) == 0
    plain_numbers = json.loads(capsys.readouterr().out)
    assert main([*COPY, "--page-bytes", "16 KiB", "--inflight-bytes", "32KiB"]) == 0
    with_units = json.loads(capsys.readouterr().out)
    assert with_units == plain_numbers and with_units["page_bytes"] == 16384


def test_copy_model_batch_lines_accept_units(tmp_path, capsys):
    batch = tmp_path / "q.jsonl"
    batch.write_text('{"hardware": "h200-sxm", "path": "kernel", "page_bytes": "16 KiB", '
                     '"pages": 100}\n'
                     '{"hardware": "h200-sxm", "path": "kernel", "page_bytes": "16 parsecs", '
                     '"pages": 100}\n')
    assert main(["copy-model", "--batch", str(batch)]) == 1
    good, bad = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert good["page_bytes"] == 16384
    assert "q.jsonl:2" in bad["error"] and "page_bytes" in bad["error"]


@pytest.mark.parametrize("option,value", [("--page-bytes", "16 parsecs"), ("--page-bytes", "0"),
                                          ("--page-bytes", "-4 KiB"),
                                          ("--inflight-bytes", "1.5 B")])
def test_a_bad_size_exits_2_naming_the_option(option, value):
    argv = [*COPY, "--page-bytes", "16 KiB", option, value]
    out = kvsim(*argv)
    assert out.returncode == 2
    assert f"argument {option}:" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("usage: kvsim copy-model")


def test_every_byte_size_option_takes_units():
    """Options whose name says bytes parse sizes (replay-cache's token counts keep k/M/G)."""
    sizes = 0
    actions = [(path, a) for path, parser in walk(build_parser()) for a in parser._actions]
    for path, action in actions:
        if any(s.endswith("-bytes") for s in action.option_strings):
            assert action.type is not None and action.type("2 KiB") == 2048, (path, action.dest)
            sizes += 1
    assert sizes >= 2  # copy-model --page-bytes and --inflight-bytes
    capacity = next(a for _, a in actions if a.dest == "capacity_tokens")
    assert capacity.type("3M") == [3_000_000]


# -- 4. a command's own usage on its errors ----------------------------------------------------
@pytest.mark.parametrize("argv,command", [
    (["run", "X", "--outt"], "run"),
    (["run", "X", "--outt", "x"], "run"),
    (["copy-model", "--hardwar", "h200-sxm", "--bogus"], "copy-model"),
    (["presets", "--jsn"], "presets"),
    (["bench", "sim-scenarios", "extra"], "bench"),
    (["sweep-report", "t.parquet", "--nope"], "sweep-report"),
])
def test_an_unknown_argument_shows_the_commands_own_usage(argv, command):
    out = kvsim(*argv)
    assert out.returncode == 2
    assert out.stderr.startswith(f"usage: kvsim {command} "), out.stderr
    assert f"kvsim {command}: error: unrecognized arguments" in out.stderr


def test_an_unknown_argument_before_the_command_is_kvsims_own():
    out = kvsim("--outt", "run", "X")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: kvsim [-h]") and "kvsim: error: unrecognized" in out.stderr


def test_a_missing_argument_shows_the_commands_usage(capsys):
    assert exits(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: kvsim run ") and "required: scenario" in err


# -- 5. help without markup, and help for every option -----------------------------------------
def test_plain_strips_literals_and_roles():
    assert plain("``kvsim run`` uses :mod:`kvsim.scenario` and :func:`~kvsim.x.run`") == \
        "kvsim run uses kvsim.scenario and run"
    assert plain("a `default role` and ``--json``") == "a default role and --json"
    assert plain(":class:`the spec <kvsim.hardware.spec.HardwareSpec>`") == "the spec"
    assert plain(None) is None and plain("") == ""


def test_every_option_of_every_command_has_help_without_markup():
    missing, marked = [], []
    parsers = list(walk(build_parser()))
    assert len(parsers) > 10
    for path, parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"kvsim {' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not (action.help or "").strip():
                missing.append(where)
            elif any(m in action.help for m in MARKUP):
                marked.append(where)
        text = parser.format_help()
        if any(m in text for m in MARKUP):
            marked.append(f"kvsim {' '.join(path)} --help")
    assert not missing, missing
    assert not marked, marked


@pytest.mark.parametrize("command", ["", "replay-cache", "detect", "bench", "presets",
                                     "copy-model"])
def test_help_output_shows_no_rest_markup(command):
    out = kvsim(*command.split(), "--help")
    assert out.returncode == 0, out.stderr
    assert not any(m in out.stdout for m in MARKUP), out.stdout
    assert out.stdout.startswith(f"usage: kvsim {command}".rstrip())


# -- 6. kvsim bench sim-scenarios from any directory -------------------------------------------
def test_bench_sim_scenarios_runs_from_another_directory(tmp_path):
    out = kvsim("bench", "sim-scenarios", "--runs", "1", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()  # one JSON object
    result = json.loads(line)
    assert result["benchmark"] == "sim_scenarios"
    from kvsim.bench.sim_scenarios import SCENARIOS

    assert set(result["scenarios"]) == set(SCENARIOS)
    assert all(s["sim_events"] > 0 and len(s["samples_s"]) == 1
               for s in result["scenarios"].values())
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


def test_bench_sim_scenarios_prints_a_summary_without_json(tmp_path, monkeypatch, capsys):
    from kvsim.bench import sim_scenarios

    seed = "scenarios/seed/h100_pcie_burst_resize.yaml"
    monkeypatch.setattr(sim_scenarios, "SCENARIOS", (seed,))
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "sim-scenarios", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    assert out.startswith("sim-scenarios (")
    assert re.search(rf"{re.escape(seed)}: 6 runs with variants \(1 reused\), [\d.]+ s, \d+ SimPy "
                     r"events", out)
    # --root names the repository explicitly
    assert main(["bench", "sim-scenarios", "--runs", "1", "--root", str(REPO), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["scenarios"]) == {seed}


def test_bench_sim_scenarios_with_a_wrong_root_exits_2(tmp_path, capsys):
    assert main(["bench", "sim-scenarios", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--root" in err and "scenarios/" in err
