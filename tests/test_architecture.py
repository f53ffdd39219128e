"""The import rules of docs/ARCHITECTURE.md: arrows point one way, no package cycles.

Every import in ``kvsim/`` and ``hw/`` (at module level or inside a function) is read from the
source; each package may import only itself and the packages on lower floors of :data:`FLOORS`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Lowest first. A package may import its own modules and any package on a lower floor; packages
# on one floor are siblings and import nothing of each other.
FLOORS: list[set[str]] = [
    {"errors"},
    {"output_dir", "validation"},  # small utilities
    {"manager"},           # pure state
    {"hardware", "llm"},   # hardware and model architectures as data
    {"model"},             # formulas: copy paths and selection, CPU cost, link sharing
    {"traces"},            # trace file formats
    {"runtime"},           # what both executors share: API table, pipeline, records, metrics
    {"serving"},           # the serving engine over the manager (a workload's engine)
    {"workloads", "replay"},
    {"sim", "hw"},         # the two executors: SimPy, and CUDA/NVML/real threads
    {"scenario"},
    {"report"},
    {"calibration", "sweep"},
    {"bench"},
    {"cli"},
    {"__main__"},  # python -m kvsim
]
FLOOR_OF = {pkg: i for i, floor in enumerate(FLOORS) for pkg in floor}


def package_of(module: str) -> str | None:
    """``kvsim.sim.link`` -> ``sim``; ``hw.executor`` -> ``hw``; anything else: None."""
    parts = module.split(".")
    if parts[0] == "hw":
        return "hw"
    if parts[0] != "kvsim":
        return None
    return parts[1] if len(parts) > 1 else "kvsim"


# Parsed once per repository: every module's parse takes ~1 s, and seven tests read this one.
@functools.cache
def imports(repo: Path = REPO) -> tuple[tuple[str, str, str, int], ...]:
    """(importing package, imported package, file, line) for every kvsim/hw import."""
    out = []
    for root in ("kvsim", "hw"):
        for path in sorted((repo / root).rglob("*.py")):
            rel = path.relative_to(repo)
            parts = rel.with_suffix("").parts
            src = "hw" if parts[0] == "hw" else (parts[1] if len(parts) > 1 else "kvsim")
            if src == "__init__":
                src = "kvsim"
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    dst = package_of(name)
                    if dst is not None and dst not in (src, "kvsim"):
                        out.append((src, dst, str(rel), node.lineno))
    return tuple(out)


def test_every_package_has_a_floor():
    packages = {p.name for p in (REPO / "kvsim").iterdir()
                if (p.is_dir() and (p / "__init__.py").exists())}
    packages |= {p.stem for p in (REPO / "kvsim").glob("*.py") if p.stem != "__init__"}
    assert packages | {"hw"} <= set(FLOOR_OF), packages - set(FLOOR_OF)


def test_imports_point_down_only():
    wrong = [f"{file}:{line}: {src} (floor {FLOOR_OF[src]}) imports {dst} (floor {FLOOR_OF[dst]})"
             for src, dst, file, line in imports() if FLOOR_OF[dst] >= FLOOR_OF[src]]
    assert not wrong, "\n".join(wrong)


def test_the_manager_imports_nothing_above_it():
    above = {dst for src, dst, _, _ in imports() if src == "manager"}
    assert above <= {"errors"}, above


@pytest.mark.parametrize("src, forbidden", [
    ("hw", {"sim"}), ("sim", {"hw"}), ("model", {"sim", "hw"}), ("runtime", {"sim", "hw"}),
    ("report", {"calibration", "sweep"}),
])
def test_siblings_and_floors_named_in_the_architecture(src, forbidden):
    found = {(dst, f"{file}:{line}") for s, dst, file, line in imports()
             if s == src and dst in forbidden}
    assert not found, found


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rule test would fail on a violation: a manager module importing the simulator."""
    (tmp_path / "kvsim" / "manager").mkdir(parents=True)
    (tmp_path / "hw").mkdir()
    (tmp_path / "kvsim" / "manager" / "probe.py").write_text(
        "def f():\n    from kvsim.sim import link  # a violation, for the test\n")
    (tmp_path / "hw" / "ok.py").write_text("from kvsim.runtime import pipeline\n")
    found = imports(tmp_path)
    assert [(s, d) for s, d, _, _ in found if FLOOR_OF[d] >= FLOOR_OF[s]] == [("manager", "sim")]
    assert ("hw", "runtime") in [(s, d) for s, d, _, _ in found]
