"""The documentation: generated pages up to date, the Python API example runs and says what it
should, links between pages resolve, and the repository stands alone (no path outside it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_generated_docs_are_up_to_date():
    """docs/scenario-format.md and docs/presets.md are what tools/make_docs.py writes now."""
    done = _run("tools/make_docs.py", "--check")
    assert done.returncode == 0, (
        "generated docs are stale; run `python tools/make_docs.py`\n" + done.stderr[-3000:])


def test_every_cpu_preset_key_the_loader_reads_is_documented(monkeypatch):
    """A key the CPU preset loader reads is either in a shipped preset (so the presets page lists
    it) or in make_docs.OPTIONAL_CPU_FIELDS (listed as optional): none is undocumented."""
    import importlib
    import json

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    make_docs = importlib.import_module("make_docs")
    loader = (ROOT / "kvsim/model/cpu_cost.py").read_text()
    read = set(re.findall(r'optional\("(\w+)"', loader)) | set(re.findall(r'key = "(\w+)"', loader))
    read |= set(re.findall(r'_flag\(path, data, "(\w+)"', loader))
    read |= set(re.findall(r'_sleep_points\(path, data, "(\w+)"', loader))
    read |= set(re.findall(r'_share\(path, data, "(\w+)"', loader))
    read |= set(re.findall(r'_field\(data, "(\w+)"\)', loader))
    read = {k for k in read if not k.startswith("gil_")}  # the hand-over's row documents those
    shipped = set()
    for path in (ROOT / "kvsim/hardware/cpu").glob("*.json"):
        shipped |= set(json.loads(path.read_text()))
    assert {"lock_test_us", "after_sleep_us", "after_sleep_factor", "host_speed_factor",
            "lock_mutex", "copy_submit_gil_free", "api_call_us"} <= read
    assert read - shipped <= set(make_docs.OPTIONAL_CPU_FIELDS), read - shipped
    presets_page = (ROOT / "docs/presets.md").read_text()
    for key in make_docs.OPTIONAL_CPU_FIELDS:
        assert f"| `{key}` | optional" in presets_page or key in shipped


def test_make_docs_is_deterministic(tmp_path, monkeypatch):
    """Two generations give the same text, whatever the working directory."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "tools/make_docs.py")
    make_docs = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_docs", make_docs)  # its dataclasses need their module
    spec.loader.exec_module(make_docs)
    for make in make_docs.PAGES.values():
        assert make() == make()
    assert _run(str(ROOT / "tools/make_docs.py"), "--check", cwd=tmp_path).returncode == 0


def _number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in the example's output:\n{text}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def example_output(tmp_path_factory) -> str:
    """examples/python_api.py's output, run from another directory (it must not depend on it)."""
    done = _run(str(ROOT / "examples/python_api.py"), cwd=tmp_path_factory.mktemp("example"))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_example_runs_the_shipped_scenario(example_output):
    out = example_output
    assert "scenario seed_burst_resize: executor sim, hardware h100-pcie, 15 variants" in out
    host = _number(r"resize calls: 1, p50 host time ([\d.]+) ms", out)
    done = _number(r"copies done \(call start to last copy landed\), p50: ([\d.]+) ms", out)
    assert 0 < host < done  # the call returns before its copies have landed
    assert "offloaded during growth: 6380 pages, 99.69 MiB" in out  # the seed's figure
    assert _number(r"reuse hit rate: ([\d.]+)", out) == 0.0
    for variant in ("h200_sxm__kernel", "gh200__kernel"):
        assert _number(rf"variant {variant}: copies done ([\d.]+) ms via \['kernel'\]", out) > 0


def test_example_builds_a_scenario(example_output):
    m = re.search(r"built in code: resize of 20001 tokens took ([\d.]+) ms, offloading (\d+) pages",
                  example_output)
    assert m, example_output
    assert float(m.group(1)) > 0 and int(m.group(2)) > 0


def test_example_drives_the_manager(example_output):
    out = example_output
    assert "probe_reuse after the first request: 1000 of 1000 tokens" in out
    offloaded = _number(r"second request's resize: ok True, offloaded (\d+) pages", out)
    assert offloaded > 0
    assert "probe_reuse now: 1000 tokens" in out  # still reusable, from the host tier
    assert _number(r"third request reused 1000 tokens; resume onboarded (\d+) pages", out) == offloaded
    assert "missed 0, hit rate 1.00" in out


def test_doc_links_resolve():
    """Every relative link in docs/*.md names a file or folder of the repository."""
    broken = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


# The repository stands alone: nothing in it may point at the folder beside it ("../" + "shared")
# or at that folder's files ("shared" + "/..."). The needles are built so this file has neither.
_SIBLING = re.compile(r"\.\./" + "shared" + r"\b|(?<![\w/.-])" + "shared" + "/")
_CHECKED = ("kvsim", "hw", "tests", "scenarios", "docs", "examples", "tools", "README.md")


def test_no_path_outside_the_repository():
    found = []
    for top in _CHECKED:
        base = ROOT / top
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path == Path(__file__).resolve():
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary data
            for n, line in enumerate(text.splitlines(), 1):
                if _SIBLING.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "paths outside the repository:\n" + "\n".join(found)
