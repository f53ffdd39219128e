"""The simulator side never needs CUDA: importing kvsim pulls in no GPU library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_importing_kvsim_and_running_the_cli_imports_no_gpu_library():
    code = (
        "import sys, kvsim, kvsim.cli, kvsim.manager, kvsim.scenario.run, kvsim.bench.burst_resize\n"
        "bad = [m for m in ('cupy', 'pynvml', 'cuda', 'torch') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_hardware_executor_needs_no_simpy():
    """The GPU machine has CuPy but not SimPy: the hw side must not import the simulator."""
    code = ("import sys, hw.executor, hw.copier, hw.rwlock, kvsim.scenario.run, kvsim.cli\n"
            "kvsim.cli.build_parser()\n"
            "print('simpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_both_module_entry_points_run_the_command_line():
    """``python -m kvsim`` and ``python -m kvsim.cli`` (used by scripts and the GPU tests)
    both reach the same parser."""
    for module in ("kvsim", "kvsim.cli"):
        out = subprocess.run([sys.executable, "-m", module, "run", "--help"],
                             capture_output=True, text=True)
        assert out.returncode == 0, (module, out.stderr)
        assert out.stdout.startswith("usage: kvsim run"), (module, out.stdout[:80])


def test_the_command_line_starts_without_the_engine():
    """``kvsim --help`` and a usage error build every command's parser; each command imports
    its engine (numpy, pydantic, the manager, the scenario schema) only when it runs."""
    code = ("import sys\n"
            "from kvsim.cli import build_parser\n"
            "build_parser().format_help()\n"
            "engine = ('numpy', 'pydantic', 'yaml', 'simpy', 'matplotlib', 'kvsim.manager',\n"
            "          'kvsim.scenario', 'kvsim.sim', 'kvsim.hardware', 'kvsim.validation')\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith(engine))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    # and the commands still run them: a scenario check reaches the schema
    res = subprocess.run([sys.executable, "-m", "kvsim", "validate-scenario",
                          "scenarios/seed/burst_resize.yaml"], capture_output=True, text=True,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr
