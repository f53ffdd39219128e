"""The concurrency model against the hardware executor, case by case (issue 23, "Concurrency").

Pre-registered in ``reports/validation-h200/concurrency/PROTOCOL.md``. Every shipped concurrency
scenario, like for like: the simulator (``executor: sim``) with the Python manager's CPU preset
fitted from a calibration made in the same device call, against the hardware executor
(``executor: hw``: the same Python manager on real threads, a real reader-writer lock, the real
GIL and real copies). The cases are :data:`CASES`: the four bug scenarios with each variant they
declare, and ``probe_during_resize`` with both lock policies at three probe intervals and two
thread counts. Every case runs with :data:`COMMON` besides its own overrides, in both executors.

Commands (``python -m kvsim.calibration.concurrency_judge ...``):

* ``cases`` lists the cases; ``manifest OUT --mode hw|no-gpu|dry-run`` writes
  ``OUT/manifest.json`` (the cases as this module defines them, checked against the scenario
  files, the mode, the time) before any run; ``order ROUND`` prints that round's
  case order (a permutation seeded by the round number); ``measure OUT --round R CASE...`` runs
  those cases once each in one process, writing ``OUT/v/CASE/rR/results.json.xz`` (slim: every
  call's times, as ``tools/slim_results.py`` keeps them, packed by
  :func:`kvsim.calibration.packed.pack_results`) and one line per run to ``OUT/runs.jsonl``. A
  run that does not finish within ``--run-limit-s`` is a hang (``hang.json``: judged as a
  deadlock); one stopped by ``--hard-end`` is cut (``cut.json``), one that raised is failed
  (``failed.json``), one whose process died is marked killed by the script (``killed.json``):
  listed, not judged. With ``--speed-probe`` each run's process also times the churn loop of
  :func:`kvsim.calibration.api_costs.speed_probe` just before and after the run, into
  ``speed.json``. These are what ``tools/concurrency_validation_runs.sh`` calls on the device
  machine.
* ``MEASURED_DIR --cpu-model PRESET --out DIR`` (the judge): predicts every judged run with the
  simulator (same case, same seed, the GIL hand-over's draws seeded by the run's round, as
  ``kvsim validate`` seeds its k-th prediction) and writes ``DIR/concurrency-judge.json`` and
  ``DIR/concurrency-judge.md``. ``--run-speed REFERENCE`` predicts each run with the preset's
  ``host_speed_factor`` replaced by the run's ``speed.json`` over REFERENCE's churn medians
  (:class:`RunSpeedPresets`; call 13 judged that rule and it missed: the preset's factor corrects
  the CPU fit's price of a probe, which a process-speed ratio leaves out).

The metrics (:data:`DEFINITIONS`), per case, over its judged runs:

* writer wait: ``starvation.longest_writer_wait_ms`` of ``results.json``, the median over runs;
* probe p50 / p99: ``KVCacheManager.probe_reuse`` call latencies (``calls[].latency_ms``) of all
  runs pooled, ``numpy.quantile`` (as ``kvsim validate``);
* starvation verdict: a run starved when ``starvation.starved`` is true; the case's verdict is
  ``yes`` when more than half of its runs starved, ``no`` when fewer, ``split`` at exactly half;
* deadlock verdict: a run deadlocked when its ``deadlocks`` list is not empty (wait-for cycles,
  stuck threads, lock hazards) or it hung; the case's verdict is ``yes`` when any run did.

Errors: ``(predicted - measured) / measured x 100``; a target is met when its absolute value is
at most :data:`TARGET_PCT` (a measured 0 is met only by a predicted 0). Verdicts must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from kvsim.calibration import api_costs
from kvsim.calibration.packed import pack_results, slim_calls
from kvsim.calibration.validate import _probes, read_results, run_bootstrap
from kvsim.errors import KvsimError
from kvsim.output_dir import open_output_dir

PROTOCOL = "reports/validation-h200/concurrency/PROTOCOL.md"
TARGET_PCT = 25.0  # issue 23: writer wait and probe p50/p99 within 25 %
SHIPPED_PRESET = "kvsim-python-h200host"  # the Python manager's CPU preset as shipped
# Both executors, every case: the selector's copy path (``auto`` is KVCM2's rule in the simulator
# but the selector in hw: with ``select`` both take the same path), and one discarded whole run
# first in the hardware executor (a warm process, as the CPU calibration and the validation
# scenario's runs are; the simulator ignores ``hw.*``).
COMMON = ("sim.copy_path=select", "hw.warmup_runs=1")
PROBE_THREADS = (4, 8)  # probe_during_resize: the scenario's 8 and the GIL fit's lower count, 4
PROBE_INTERVALS_US = (0, 500, 2000)  # closed loop (the scenario's), ~1.7x and ~7x a probe
RUN_LIMIT_S = 60.0  # a run still going after this long is a hang (the longest take ~5 s on the VM)
MODES = {"hw": ("hw", "cuda"), "no-gpu": ("hw", "none"), "dry-run": ("sim", None)}
TARGETS = ("writer_wait_ms", "probe_p50_ms", "probe_p99_ms", "starvation", "deadlock")
RESULT_FILES = ("results.json", "results.json.xz", "results.json.gz")
# hang: judged (as deadlocked); cut (by the call's end), failed (raised), killed (the process
# died or was killed without writing a result, marked by the script): listed, not judged
STATUS_FILES = {"hang.json": "hang", "cut.json": "cut", "failed.json": "failed",
                "killed.json": "killed"}

DEFINITIONS = {
    "writer_wait_ms": "results.json starvation.longest_writer_wait_ms (the longest wait of any "
                      "non-nested exclusive lock request in the run), median over the case's runs",
    "probe_p50_ms": "KVCacheManager.probe_reuse latencies (results.json calls[].latency_ms) of "
                    "all the case's runs pooled, numpy.quantile(q=0.5)",
    "probe_p99_ms": "the same probes, numpy.quantile(q=0.99)",
    "starvation": "a run starved when results.json starvation.starved is true (readers that "
                  "entered after the longest-waiting writer asked delayed it); the case: 'yes' "
                  "when more than half its runs starved, 'no' when fewer, 'split' at half",
    "deadlock": "a run deadlocked when results.json deadlocks is not empty (wait-for cycles, "
                "stuck threads, lock hazards) or it hung (no result within the run limit); the "
                "case: 'yes' when any run deadlocked",
    "error_pct": "(predicted - measured) / measured x 100; met when |error| <= 25 % (a measured "
                 "0 is met only by a predicted 0)",
}


@dataclass(frozen=True)
class Case:
    """One case: a shipped scenario file (relative to the repository root), one of its
    variants, and ``--set`` overrides of its own (applied before the variant's)."""

    name: str
    file: str
    variant: str
    knobs: tuple[str, ...] = ()


BUG_FILES = {"probe_starvation": ("buggy", "fixed"), "probe_drain": ("buggy", "fixed"),
             "gil_deadlock": ("buggy", "fixed"), "seed_concurrency_tests": ("buggy", "fixed")}
PDR_FILE = "scenarios/concurrency/probe_during_resize.yaml"
PDR_VARIANTS = ("reader_preference", "writer_preference")

CASES: tuple[Case, ...] = (
    *(Case(f"{stem}.{v}", f"scenarios/bugs/{stem}.yaml", v)
      for stem, variants in BUG_FILES.items() for v in variants),
    *(Case(f"probe_during_resize.{v}.t{t}.i{i}", PDR_FILE, v,
           (f"workload.probe_threads={t}", f"workload.probe_interval_us={i}"))
      for v in PDR_VARIANTS for t in PROBE_THREADS for i in PROBE_INTERVALS_US),
)
CASE_BY_NAME = {c.name: c for c in CASES}


def default_root() -> Path:
    """The repository holding this module if it has ``scenarios/``, else the current directory
    (on the device machine kvsim may be imported from elsewhere)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "scenarios").is_dir() else Path.cwd()


def _case(name: str) -> Case:
    try:
        return CASE_BY_NAME[name]
    except KeyError:
        raise KvsimError(f"no case {name!r}; the cases are: {', '.join(CASE_BY_NAME)}") from None


def check_cases(root: Path) -> None:
    """The case table against the scenario files: every file exists, every case's variant is
    declared, and every variant a file declares is a case (so no variant is left out)."""
    from kvsim.scenario.load import load_scenario_file

    by_file: dict[str, set[str]] = {}
    for c in CASES:
        by_file.setdefault(c.file, set()).add(c.variant)
    for file, variants in by_file.items():
        path = root / file
        if not path.is_file():
            raise KvsimError(f"{path}: scenario file of the concurrency cases not found "
                             f"(--root {root} is not the repository root?)")
        declared = {v.name for v, _ in load_scenario_file(path).variants}
        if declared != variants:
            raise KvsimError(f"{path}: declares variants {sorted(declared)}, the case table "
                             f"(kvsim/calibration/concurrency_judge.py) has {sorted(variants)}")


def case_scenario(case: Case, executor: str, cpu_model: str, root: Path,
                  gil_seed: int | None = None, hw_copier: str | None = None):
    """The case's scenario for ``executor``: the file with COMMON, the case's knobs, the
    executor and CPU preset as overrides, then the case's variant."""
    from kvsim.scenario.load import load_scenario_file

    overrides = [f"executor={executor}", f"cpu_model={cpu_model}", *COMMON, *case.knobs]
    if hw_copier is not None:
        overrides.append(f"hw.copier={hw_copier}")
    sf = load_scenario_file(root / case.file, overrides)
    found = {v.name: s for v, s in sf.variants}
    if case.variant not in found:
        raise KvsimError(f"{root / case.file}: case {case.name}: no variant {case.variant!r} "
                         f"(the file declares {sorted(found)})")
    scenario = found[case.variant]
    if gil_seed is not None:
        scenario = replace(scenario, sim=replace(scenario.sim, gil_seed=gil_seed))
    return scenario


def source_digest(root: Path) -> str:
    """SHA-256 over the code and data the runs and predictions depend on (``kvsim/**/*.py`` and
    ``*.json``, ``hw/**/*.py``, the cases' scenario files), path and content: the manifest keeps
    the device's, the judge compares its own (the device's copy of the tree has no git)."""
    import hashlib

    files = sorted({*root.glob("kvsim/**/*.py"), *root.glob("kvsim/**/*.json"),
                    *root.glob("hw/**/*.py"), *(root / c.file for c in CASES)})
    h = hashlib.sha256()
    for f in files:
        if "__pycache__" in f.parts:
            continue
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def round_order(round_no: int, call_seed: int = 0) -> list[str]:
    """Round ``round_no``'s case order: the case table shuffled by ``random.Random(round_no)``,
    so every case takes every place over the rounds and drift falls on all cases alike. With
    ``call_seed`` (not 0) the shuffle is seeded by both, so that calls differ in their orders
    too: with 0, as calls 4 to 11 ran, every call repeats the same orders and an effect of a
    case's place (what ran before it in its process) repeats with them."""
    names = [c.name for c in CASES]
    random.Random(round_no if not call_seed else f"{call_seed}:{round_no}").shuffle(names)
    return names


def cpu_model_arg(value: str) -> str:
    """A preset name as given, a preset file as an absolute path (a relative path in a scenario
    is taken relative to the scenario file, not to the current directory)."""
    path = Path(value)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise KvsimError(f"--cpu-model {value}: no such file")
        return str(path.resolve())
    return value


# -- the device side ----------------------------------------------------------------------------
def write_manifest(out: Path, mode: str, root: Path, budget_s: float | None) -> Path:
    if mode not in MODES:
        raise KvsimError(f"--mode {mode}: must be one of {', '.join(MODES)}")
    check_cases(root)
    out = open_output_dir(out)
    path = out / "manifest.json"
    if path.exists():
        raise KvsimError(f"{path}: exists: this directory holds a call already; give a new one")
    executor, copier = MODES[mode]
    path.write_text(json.dumps({
        "what": "concurrency validation runs (kvsim.calibration.concurrency_judge); protocol "
                + PROTOCOL,
        "mode": mode, "executor": executor, "hw_copier": copier,
        "common_overrides": list(COMMON), "run_limit_s": RUN_LIMIT_S, "budget_s": budget_s,
        "source_digest": source_digest(root),
        "cases": [{"name": c.name, "file": c.file, "variant": c.variant, "knobs": list(c.knobs)}
                  for c in CASES],
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }, indent=1) + "\n")
    return path


def slim(results: dict) -> dict:
    """The results object as results.json holds it, its calls slim
    (:func:`kvsim.calibration.packed.slim_calls`, as tools/slim_results.py), ready for
    :func:`pack_results`."""
    from kvsim.scenario.results import finite, public

    data = finite(public(results))
    data["calls"] = slim_calls(data["calls"])
    return data


def _log(out: Path, line: dict) -> None:
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def measure(out: Path, round_no: int, names: list[str], mode: str, cpu_model: str, root: Path,
            until: float | None, hard_end: float | None, run_limit_s: float = RUN_LIMIT_S,
            say=lambda m: None, speed_probe: bool = False) -> int:
    """Run each named case once (round ``round_no``) in this process; returns how many ran.
    No run starts at or after ``until`` (Unix time); a run still going ``run_limit_s`` after its
    start is a hang, one still going at ``hard_end`` is cut: either ends this process (exit 3)
    once its marker and log line are written. With ``speed_probe``, the churn loop of
    :func:`kvsim.calibration.api_costs.speed_probe` runs in this process just before and just
    after each run, into the run's ``speed.json`` (the judge's ``--run-speed``)."""
    from kvsim.scenario.run import execute, missing_requirement

    if not (out / "manifest.json").is_file():
        raise KvsimError(f"{out}/manifest.json: missing: write it first (the manifest command)")
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.get("mode") != mode:
        raise KvsimError(f"{out}/manifest.json: mode is {manifest.get('mode')!r}, this "
                         f"measure was asked for {mode!r}")
    executor, copier = MODES[mode]
    cases = [_case(n) for n in names]
    ran = 0
    for case in cases:
        now = time.time()
        if until is not None and now >= until:
            say(f"round {round_no}: deadline reached before {case.name}")
            break
        run_dir = out / "v" / case.name / f"r{round_no}"
        if run_dir.exists() and any(run_dir.iterdir()):
            raise KvsimError(f"{run_dir}: holds a run already (round {round_no} of {case.name})")
        scenario = case_scenario(case, executor, cpu_model, root, hw_copier=copier)
        if executor == "sim":  # the dry run: round R's GIL draws, as the judge predicts round R
            scenario = replace(scenario, sim=replace(scenario.sim,
                                                     gil_seed=scenario.seed + round_no - 1))
        missing = missing_requirement(scenario)
        if missing:
            raise KvsimError(f"{case.file}: {missing}")
        run_dir.mkdir(parents=True, exist_ok=True)
        line = {"case": case.name, "round": round_no, "mode": mode, "started_unix": now,
                "cpu_model": cpu_model}
        limit = run_limit_s
        cut = hard_end is not None and hard_end - now < run_limit_s
        if cut:
            limit = max(0.0, hard_end - now)

        def fire(run_dir: Path = run_dir, line: dict = line, cut: bool = cut,
                 limit: float = limit) -> None:
            status = "cut" if cut else "hang"
            why = (f"stopped at the call's hard end, {limit:.1f} s after it started" if cut else
                   f"no result {limit:.1f} s after it started: a hang")
            (run_dir / f"{status}.json").write_text(json.dumps({**line, "status": status,
                                                                "why": why}) + "\n")
            _log(out, {**line, "status": status, "wall_s": limit, "why": why})
            print(f"concurrency_judge measure: {line['case']} r{round_no}: {why}", file=sys.stderr)
            os._exit(3)

        before = api_costs.speed_probe() if speed_probe else None
        watchdog = threading.Timer(limit, fire)
        watchdog.daemon = True
        watchdog.start()
        t0 = time.perf_counter()
        try:
            results = execute(scenario)
        except Exception as e:  # noqa: BLE001 - a run that fails is recorded, the next goes on
            watchdog.cancel()
            text = traceback.format_exc()
            (run_dir / "failed.json").write_text(json.dumps({**line, "status": "failed",
                                                             "error": text}) + "\n")
            _log(out, {**line, "status": "failed", "wall_s": time.perf_counter() - t0,
                       "error": f"{type(e).__name__}: {e}"})
            say(f"{case.name} r{round_no}: failed: {type(e).__name__}: {e}")
            ran += 1
            continue
        watchdog.cancel()
        wall = time.perf_counter() - t0
        if before is not None:
            _write_speed(run_dir, before, api_costs.speed_probe())
        tmp = run_dir / "results.json.xz.part"
        tmp.write_bytes(pack_results(slim(results)))
        tmp.rename(run_dir / "results.json.xz")
        _log(out, {**line, "status": "ok", "wall_s": wall})
        say(f"{case.name} r{round_no}: {wall:.2f} s")
        ran += 1
    return ran


SPEED_FILE = "speed.json"


def _write_speed(run_dir: Path, before: dict[str, float], after: dict[str, float]) -> None:
    (run_dir / SPEED_FILE).write_text(json.dumps({
        "what": "this run's process speed: kvsim.calibration.api_costs.speed_probe() (the "
                "churn loop, 300 calls of each method after 10 warm-up iterations, median "
                "microseconds per method) just before and just after the run, in its process",
        "before": before, "after": after}, indent=1, sort_keys=True) + "\n")


SPEED_PROBES = {"both": ("before", "after"), "before": ("before",)}


def run_speed(run: Run, reference: dict[str, float], probes: str = "both") -> float:
    """``run``'s process speed over the reference's (> 1: slower): its ``speed.json`` probes
    (``both``: before and, for a run that ended, after; ``before``: the one before the run) by
    :func:`api_costs.speed_ratio`."""
    path = run.directory / SPEED_FILE
    if not path.is_file():
        raise KvsimError(f"{path}: missing: --run-speed needs every judged run's speed probe "
                         "(measure --speed-probe)")
    try:
        data = json.loads(path.read_text())
        taken = [data[k] for k in SPEED_PROBES[probes] if isinstance(data.get(k), dict)]
        return api_costs.speed_ratio(taken, reference)
    except (json.JSONDecodeError, ValueError, TypeError, ZeroDivisionError) as e:
        raise KvsimError(f"{path}: not a speed probe: {e}") from None


# -- the judge ----------------------------------------------------------------------------------
@dataclass
class Run:
    case: str
    round: int
    directory: Path
    status: str  # ok | hang | cut | failed | killed
    results: dict | None = None


def _round_of(d: Path) -> int:
    if not (d.name.startswith("r") and d.name[1:].isdigit() and int(d.name[1:]) >= 1):
        raise KvsimError(f"{d}: not a run directory (expected r1, r2, ...)")
    return int(d.name[1:])


def load_runs(measured: Path, allow_lost: bool = False
              ) -> tuple[dict, dict[str, list[Run]], list[str]]:
    """The manifest, every run under ``measured/v`` and the runs lost: checked against
    ``runs.jsonl``, a run the log lists that is not here is an error, or with ``allow_lost``
    one of the lost (a run here in another state than the log says is always an error)."""
    mpath = measured / "manifest.json"
    if not mpath.is_file():
        raise KvsimError(f"{mpath}: missing (not a directory the concurrency runs wrote)")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise KvsimError(f"{mpath}: not JSON: {e}") from None
    mode = manifest.get("mode")
    if mode not in MODES:
        raise KvsimError(f"{mpath}: mode: must be one of {', '.join(MODES)}, got {mode!r}")
    runs: dict[str, list[Run]] = {}
    vdir = measured / "v"
    if not vdir.is_dir():
        raise KvsimError(f"{vdir}: missing: no runs")
    for cdir in sorted(p for p in vdir.iterdir() if p.is_dir()):
        if cdir.name not in CASE_BY_NAME:
            raise KvsimError(f"{cdir}: not a case of kvsim/calibration/concurrency_judge.py "
                             f"(python -m kvsim.calibration.concurrency_judge cases)")
        for rdir in sorted((p for p in cdir.iterdir() if p.is_dir()), key=_round_of):
            files = {p.name for p in rdir.iterdir()}
            statuses = [s for f, s in STATUS_FILES.items() if f in files]
            if any(f in files for f in RESULT_FILES):
                statuses.append("ok")
            if len(statuses) != 1:
                raise KvsimError(f"{rdir}: expected exactly one of results.json[.xz|.gz], "
                                 f"{', '.join(STATUS_FILES)}; found {sorted(files) or 'nothing'}")
            run = Run(cdir.name, _round_of(rdir), rdir, statuses[0])
            if run.status == "ok":
                run.results = read_results(rdir)
            runs.setdefault(cdir.name, []).append(run)
    log = measured / "runs.jsonl"
    lost: list[str] = []
    if log.is_file():  # every run the log says finished must be here (none lost on the way)
        for n, text in enumerate(log.read_text().splitlines(), 1):
            if not text.strip():
                continue
            try:
                entry = json.loads(text)
                where = (entry["case"], int(entry["round"]), entry["status"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise KvsimError(f"{log}:{n}: not a run line (case, round, status)") from None
            have = {(r.case, r.round): r.status for r in runs.get(where[0], [])}
            if allow_lost and where[:2] not in have:
                lost.append(f"{where[0]} r{where[1]} ({where[2]})")
                continue
            if have.get(where[:2]) != where[2]:
                raise KvsimError(f"{log}:{n}: {where[0]} r{where[1]} {where[2]}, but "
                                 f"{vdir / where[0] / f'r{where[1]}'} holds "
                                 f"{have.get(where[:2], 'nothing')}"
                                 + ("" if where[:2] in have else
                                    " (lost on the way back? --allow-lost judges the rest)"))
    if not runs:
        raise KvsimError(f"{vdir}: no runs")
    return manifest, runs, lost


def _check_same_case(run: Run, measured: dict, predicted: dict, executor: str) -> None:
    """The measured run ran this case: same scenario file, seed, hardware, manager, workload and
    lock, copy path and GIL-release settings as the prediction."""
    where = f"{run.directory}/results.json"
    if measured.get("executor") != executor:
        raise KvsimError(f"{where}: executor: {measured.get('executor')!r}, the manifest's mode "
                         f"says {executor!r}")
    mr, pr = measured.get("resolved"), predicted["resolved"]
    if not isinstance(mr, dict):
        raise KvsimError(f"{where}: resolved: missing (results from an older kvsim?)")
    checks = [("scenario.seed", measured.get("scenario", {}).get("seed"), predicted["scenario"]["seed"]),
              ("hardware", measured.get("hardware"), predicted["hardware"])]
    checks += [(f"resolved.{k}", mr.get(k), pr[k]) for k in ("manager", "workload")]
    checks += [(f"resolved.sim.{k}", (mr.get("sim") or {}).get(k), pr["sim"][k])
               for k in ("lock_policy", "copy_path", "gil_release", "wait_for_copies")]
    for field, m, p in checks:
        if m != p:
            raise KvsimError(f"{where}: {field}: {json.dumps(m)} is not case {run.case}'s "
                             f"{json.dumps(p)}")


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None:
        return None
    if meas == 0:
        return 0.0 if pred == 0 else None
    return (pred - meas) / meas * 100


def _metric(meas: float | None, pred: float | None) -> dict:
    err = _err(pred, meas)
    applicable = meas is not None and pred is not None
    return {"measured": meas, "predicted": pred, "error_pct": err,
            "met": (err is not None and abs(err) <= TARGET_PCT) if applicable else None}


def _verdict_share(flags: list[bool], rule: str) -> str | None:
    if not flags:
        return None
    if rule == "any":
        return "yes" if any(flags) else "no"
    share = sum(flags) / len(flags)
    return "yes" if share > 0.5 else "no" if share < 0.5 else "split"


def _starved(r: dict) -> bool:
    return bool((r.get("starvation") or {}).get("starved"))


def _writer(r: dict) -> dict:
    return r.get("starvation") or {}


def predict_run(base, round_no: int) -> dict:
    """The simulator's prediction of a case's run of round ``round_no`` (``base``:
    :func:`case_scenario` with executor sim): its GIL draws seeded by the round, slimmed like
    the measured runs (call times to 0.1 us) so both are read alike."""
    from kvsim.scenario.run import execute

    return slim(execute(replace(base, sim=replace(base.sim, gil_seed=base.seed + round_no - 1))))


def predict_runs(case: Case, rounds: list[int], cpu_model: str | list[str], root: Path
                 ) -> list[dict]:
    """The simulator's predictions of ``case``'s runs of ``rounds`` (:func:`predict_run`), with
    one CPU preset, or one per round (``--run-speed``: each run's own host speed)."""
    presets = [cpu_model] * len(rounds) if isinstance(cpu_model, str) else cpu_model
    bases: dict[str, object] = {}
    out = []
    for r, cpu in zip(rounds, presets, strict=True):
        if cpu not in bases:
            bases[cpu] = case_scenario(case, "sim", cpu, root)
        out.append(predict_run(bases[cpu], r))
    return out


def judged_runs(runs: list[Run]) -> list[Run]:
    """The runs a case is judged on: those that finished, and hangs (judged as deadlocks)."""
    return [r for r in runs if r.status in ("ok", "hang")]


def judge_case(case: Case, runs: list[Run], executor: str, cpu_model: str, root: Path,
               cpu_of=None) -> dict:
    """One case's figures and verdicts; ``cpu_of(run)``, when given, is the preset for that
    run's prediction (``--run-speed``), else ``cpu_model`` serves every run."""
    judged = judged_runs(runs)
    done = [r for r in judged if r.status == "ok"]
    presets = [cpu_of(r) for r in judged] if cpu_of is not None else cpu_model
    preds = predict_runs(case, [r.round for r in judged], presets, root)  # one per judged run
    for r, p in zip(judged, preds):
        if r.status == "ok":
            _check_same_case(r, r.results, p, executor)
    pred_done = [p for r, p in zip(judged, preds) if r.status == "ok"]
    out: dict = {"file": case.file, "variant": case.variant, "knobs": list(case.knobs),
                 "common_overrides": list(COMMON),
                 "runs_judged": [f"r{r.round}" for r in judged],
                 "runs_hung": [f"r{r.round}" for r in judged if r.status == "hang"],
                 "runs_not_judged": {f"r{r.round}": r.status for r in runs if r not in judged}}
    mw = [_writer(r.results).get("longest_writer_wait_ms") for r in done]
    pw = [_writer(p).get("longest_writer_wait_ms") for p in pred_done]
    mw_ok, pw_ok = [w for w in mw if w is not None], [w for w in pw if w is not None]
    out["writer_wait_ms"] = _metric(statistics.median(mw_ok) if mw_ok else None,
                                    statistics.median(pw_ok) if pw_ok else None)
    out["writer_wait_ms"] |= {"measured_per_run": mw, "predicted_per_run": pw}
    meas_runs = [_probes(r.results, None) for r in done]
    pred_runs = [_probes(p, None) for p in pred_done]
    meas_all = [x for xs in meas_runs for x in xs]
    pred_all = [x for xs in pred_runs for x in xs]
    for q, key in ((0.5, "probe_p50_ms"), (0.99, "probe_p99_ms")):
        m = float(np.quantile(meas_all, q)) if meas_all else None
        p = float(np.quantile(pred_all, q)) if pred_all else None
        ci = run_bootstrap([xs for xs in meas_runs if xs], q) if meas_all else None
        out[key] = _metric(m, p) | {
            "measured_count": len(meas_all), "predicted_count": len(pred_all),
            "measured_per_run": [float(np.quantile(xs, q)) if xs else None for xs in meas_runs],
            "predicted_per_run": [float(np.quantile(xs, q)) if xs else None for xs in pred_runs],
            "measured_run_bootstrap_ci90": ci,
            "predicted_within_run_ci90": None if ci is None or p is None else ci[0] <= p <= ci[1]}
    ms = [_starved(r.results) for r in done]
    ps = [_starved(p) for p in pred_done]
    out["starvation"] = {"measured": _verdict_share(ms, "majority"),
                         "predicted": _verdict_share(ps, "majority"),
                         "measured_runs_starved": f"{sum(ms)}/{len(ms)}",
                         "predicted_runs_starved": f"{sum(ps)}/{len(ps)}"}
    md = [r.status == "hang" or bool(r.results["deadlocks"]) for r in judged]
    pd = [bool(p["deadlocks"]) for p in preds]
    out["deadlock"] = {"measured": _verdict_share(md, "any"), "predicted": _verdict_share(pd, "any"),
                       "measured_runs_deadlocked": f"{sum(md)}/{len(md)}",
                       "predicted_runs_deadlocked": f"{sum(pd)}/{len(pd)}",
                       "measured_kinds": sorted({d.get("kind") for r in done
                                                 for d in r.results["deadlocks"]}
                                                | ({"hang"} if out["runs_hung"] else set())),
                       "predicted_kinds": sorted({d.get("kind") for p in preds
                                                  for d in p["deadlocks"]})}
    for key in ("starvation", "deadlock"):
        v = out[key]
        v["met"] = (v["measured"] == v["predicted"]) if v["measured"] is not None else None
    # Context, not targets: what the longest writer was, how many readers overtook it.
    out["context"] = {
        side: {"longest_writer_api": sorted({str(_writer(r).get("api")) for r in rs}),
               "readers_entered_while_waiting_median": median_of(
                   [_writer(r).get("readers_entered_while_waiting") for r in rs]),
               "wait_caused_by_overtaking_readers_ms_median": median_of(
                   [_writer(r).get("wait_caused_by_overtaking_readers_ms") for r in rs]),
               "violations": sum(len(r.get("violations", [])) for r in rs),
               "failed_calls": sum(1 for r in rs for c in r["calls"] if not c["ok"]),
               "thread_errors": sum(len((r.get("hw") or {}).get("thread_errors") or []) for r in rs)}
        for side, rs in (("measured", [r.results for r in done]), ("predicted", pred_done))}
    targets = {k: out[k]["met"] for k in TARGETS}
    out["targets"] = {k: ("n/a" if v is None else "met" if v else "missed")
                      for k, v in targets.items()}
    return out


def median_of(values: list) -> float | None:
    """The median of the values that are not None; None when there are none."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


class RunSpeedPresets:
    """``--run-speed``: for each run, the CPU preset with ``host_speed_factor`` replaced by the
    run's own process speed over the calibration's (:func:`run_speed`), written once per
    distinct factor into ``workdir``. The preset's other terms stay as they are.

    Every judged run's speed is read once, here, before any prediction (a missing or bad
    ``speed.json`` stops the judge before its work). ``relative`` (``--run-speed-relative``):
    the preset's own factor (``own_factor``) times the run's speed over the median of the
    judged runs' speeds instead, so that the preset's level stays (call 13: that factor corrects
    the CPU fit's price of a probe, not a speed) and only the runs' spread around the call is
    added."""

    def __init__(self, preset_file: Path, reference_file: Path, workdir: Path,
                 judged: list[Run], relative: bool = False, own_factor: float = 1.0,
                 probes: str = "both") -> None:
        try:
            self.preset = json.loads(preset_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise KvsimError(f"--cpu-model {preset_file}: --run-speed needs a preset JSON "
                             f"file: {e}") from None
        from kvsim.calibration.packed import read_json

        self.reference_file = reference_file
        reference = api_costs.reference_medians(read_json(reference_file), str(reference_file))
        self.source = str(preset_file)
        self.workdir = workdir
        self.speeds = {(r.case, r.round): run_speed(r, reference, probes) for r in judged}
        self.factors: dict[str, dict[str, float]] = {}
        self.scale = 1.0  # absolute: the run's ratio is the factor
        if relative:
            if not self.speeds:
                raise KvsimError("--run-speed-relative: no judged run to take the median of")
            self.scale = own_factor / statistics.median(self.speeds.values())

    def __call__(self, run: Run) -> str:
        factor = round(self.speeds[(run.case, run.round)] * self.scale, 4)
        self.factors.setdefault(run.case, {})[f"r{run.round}"] = factor
        path = self.workdir / f"preset-speed-{factor:.4f}.json"
        if not path.is_file():
            data = dict(self.preset)
            data["host_speed_factor"] = {
                "value": factor,
                "source": f"{run.directory / SPEED_FILE}: the run's churn-loop medians over "
                          f"{self.reference_file}'s (kvsim.calibration.concurrency_judge "
                          f"--run-speed), in place of {self.source}'s"}
            path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return str(path)


def judge(measured: Path, cpu_model: str, root: Path, say=lambda m: None,
          allow_lost: bool = False, run_speed_reference: Path | None = None,
          run_speed_relative: bool = False, run_speed_probes: str = "both") -> dict:
    """Every case judged (:func:`judge_case`). With ``run_speed_reference`` (a calibration
    samples file, or a speed probe file) each run is predicted at its own process speed
    (:class:`RunSpeedPresets`; ``run_speed_relative`` and ``run_speed_probes`` as there)."""
    import tempfile

    manifest, runs, lost = load_runs(measured, allow_lost)
    executor = MODES[manifest["mode"]][0]
    digest = source_digest(root)
    cpu = cpu_model_arg(cpu_model)
    from kvsim.model.cpu_cost import load_cpu_model

    preset = load_cpu_model(cpu)
    if not preset.holds_gil:
        raise KvsimError(f"--cpu-model {cpu_model}: {preset.name} is not a Python manager's "
                         "preset (holds_gil is false): the judge is like for like")
    with tempfile.TemporaryDirectory(prefix="kvsim-run-speed-") as tmp:
        judged = [r for case_runs in runs.values() for r in judged_runs(case_runs)]
        speeds = (RunSpeedPresets(Path(cpu), run_speed_reference, Path(tmp), judged,
                                  run_speed_relative, preset.host_speed_factor, run_speed_probes)
                  if run_speed_reference is not None else None)
        result = _judge_cases(runs, executor, cpu, root, say, speeds)
    result.update({
        "what": "the concurrency model (executor sim, the Python manager's CPU preset) against "
                "measured runs, case by case (kvsim.calibration.concurrency_judge)",
        "protocol": PROTOCOL, "measured_dir": str(measured), "mode": manifest["mode"],
        "measured_executor": executor, "manifest_started_utc": manifest.get("started_utc"),
        "cpu_model": {"given": cpu_model, "name": preset.name,
                      "host_speed_factor": getattr(preset, "host_speed_factor", None)},
        "source_digest": {"measured": manifest.get("source_digest"), "judge": digest,
                          "same": manifest.get("source_digest") == digest},
        "target_pct": TARGET_PCT, "definitions": DEFINITIONS, "runs_lost": lost,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    })
    if speeds is not None:
        probes = {"both": "the before/after mean", "before": "the probe before the run"}
        rule = ("each run predicted with host_speed_factor = its speed.json churn medians over "
                f"the reference's (median over methods of {probes[run_speed_probes]})")
        if run_speed_relative:
            rule += (", times the preset's own factor over the median of that ratio over the "
                     "call's judged runs")
        result["run_speed"] = {"reference": str(run_speed_reference), "rule": rule,
                               "relative": run_speed_relative, "probes": run_speed_probes,
                               "factors": speeds.factors}
    return result


def _judge_cases(runs: dict[str, list[Run]], executor: str, cpu: str, root: Path, say,
                 speeds) -> dict:
    cases: dict[str, dict] = {}
    for case in CASES:
        if case.name not in runs:
            cases[case.name] = {"file": case.file, "variant": case.variant, "runs_judged": [],
                                "targets": {}, "missing": "no run of this case"}
            continue
        t0 = time.perf_counter()
        cases[case.name] = judge_case(case, runs[case.name], executor, cpu, root, speeds)
        say(f"{case.name}: {len(cases[case.name]['runs_judged'])} runs, "
            f"{time.perf_counter() - t0:.1f} s")
    tally = {k: {"met": 0, "missed": 0, "n/a": 0, "no_run": 0} for k in TARGETS}
    for c in cases.values():
        for k in TARGETS:
            tally[k][c["targets"].get(k, "no_run")] += 1
    return {"cases": cases, "tally": tally}


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _cell(m: dict) -> str:
    if m.get("measured") is None and m.get("predicted") is None:
        return "n/a"
    err = m.get("error_pct")
    return (f"{_fmt(m['measured'])} / {_fmt(m['predicted'])} / "
            f"{'-' if err is None else f'{err:+.1f} %'}")


def markdown(result: dict) -> str:
    dry = result["mode"] != "hw"
    lines = [f"# Concurrency judge: {result['measured_dir']}", ""]
    if dry:
        lines += [f"**Mode {result['mode']}: the 'measured' runs are not a GPU measurement** "
                  f"(executor {result['measured_executor']}).", ""]
    d = result["source_digest"]
    lines += ["Code and scenario files (`source_digest`): "
              + ("the same as the runs'." if d["same"] else
                 f"**not the runs'** (runs {d['measured']}, judge {d['judge']}): the judge's "
                 "model is not the one the device ran."), ""]
    lines += [f"Predicted: executor sim, CPU preset {result['cpu_model']['name']} "
              f"(`{result['cpu_model']['given']}`); protocol `{result['protocol']}`. Cells: "
              "measured / predicted / error; a target is met within "
              f"{result['target_pct']:g} %, a verdict when equal. Definitions in "
              "concurrency-judge.json (`definitions`).", ""]
    if "run_speed" in result:
        factors = [f for c in result["run_speed"]["factors"].values() for f in c.values()]
        lines += [f"Each run predicted at its own process speed (`--run-speed "
                  f"{result['run_speed']['reference']}`): host_speed_factor "
                  f"{min(factors):.3f}-{max(factors):.3f} over {len(factors)} runs, median "
                  f"{statistics.median(factors):.3f} (`run_speed.factors` in the JSON).", ""]
    lines += [
              "| case | runs | writer wait ms | probe p50 ms | probe p99 ms | starved (meas/pred) "
              "| deadlock (meas/pred) | targets met |", "|---|---|---|---|---|---|---|---|"]
    for name, c in result["cases"].items():
        if "missing" in c:
            lines.append(f"| {name} | 0 | - | - | - | - | - | no run |")
            continue
        t = c["targets"]
        met = sum(v == "met" for v in t.values())
        applicable = sum(v != "n/a" for v in t.values())
        s, d = c["starvation"], c["deadlock"]
        lines.append(
            f"| {name} | {len(c['runs_judged'])} | {_cell(c['writer_wait_ms'])} | "
            f"{_cell(c['probe_p50_ms'])} | {_cell(c['probe_p99_ms'])} | "
            f"{s['measured'] or '-'} ({s['measured_runs_starved']}) / {s['predicted'] or '-'} "
            f"({s['predicted_runs_starved']}) | {d['measured'] or '-'} / {d['predicted'] or '-'} | "
            f"{met}/{applicable}"
            + "".join(f" {k}:missed" for k, v in t.items() if v == "missed") + " |")
    lines += ["", "| target | met | missed | n/a | no run |", "|---|---|---|---|---|"]
    for k, v in result["tally"].items():
        lines.append(f"| {k} | {v['met']} | {v['missed']} | {v['n/a']} | {v['no_run']} |")
    unjudged = [f"{n} {r} ({s})" for n, c in result["cases"].items()
                for r, s in c.get("runs_not_judged", {}).items()]
    hung = [f"{n} {r}" for n, c in result["cases"].items() for r in c.get("runs_hung", [])]
    lines += ["", f"Runs hung (judged as deadlocked): {', '.join(hung) or 'none'}.",
              f"Runs lost on the way back (logged, not returned): "
              f"{', '.join(result['runs_lost']) or 'none'}.",
              f"Runs not judged (cut by the call's end, failed or killed): "
              f"{', '.join(unjudged) or 'none'}.",
              ""]
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------
def _judge_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvsim.calibration.concurrency_judge",
        description="predict every concurrency case with the simulator and compare with the "
                    "measured runs (other commands: manifest, order, measure)")
    p.add_argument("measured", help="the directory tools/concurrency_validation_runs.sh wrote")
    p.add_argument("--cpu-model", required=True,
                   help="the CPU preset (name or JSON file) fitted from the same call")
    p.add_argument("--out", required=True, help="report directory")
    p.add_argument("--root", default=None, help="repository root (default: this checkout)")
    p.add_argument("--allow-lost", action="store_true",
                   help="judge the runs that came back when runs.jsonl lists more (listed as lost)")
    p.add_argument("--run-speed", default=None, metavar="REFERENCE",
                   help="predict each run at its own process speed: its speed.json (measure "
                        "--speed-probe) over REFERENCE's churn medians (the calibration's "
                        "samples file, .json or .json.xz)")
    p.add_argument("--run-speed-relative", action="store_true",
                   help="with --run-speed: keep the preset's host_speed_factor as the level and "
                        "scale it by each run's speed over the call's median run speed")
    p.add_argument("--run-speed-probes", choices=sorted(SPEED_PROBES), default="both",
                   help="with --run-speed: the probes a run's speed is taken from (default both)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    if (a.run_speed_relative or a.run_speed_probes != "both") and not a.run_speed:
        p.error("--run-speed-relative and --run-speed-probes need --run-speed")
    say = (lambda m: None) if a.quiet else (lambda m: print(f"concurrency_judge: {m}", file=sys.stderr))
    try:
        out = open_output_dir(a.out)
        result = judge(Path(a.measured), a.cpu_model, Path(a.root) if a.root else default_root(),
                       say, a.allow_lost, Path(a.run_speed) if a.run_speed else None,
                       a.run_speed_relative, a.run_speed_probes)
    except (KvsimError, OSError, ValueError) as e:
        print(f"concurrency_judge: {e}", file=sys.stderr)
        return 2
    (out / "concurrency-judge.json").write_text(json.dumps(result, indent=1, sort_keys=True,
                                                           allow_nan=False) + "\n")
    (out / "concurrency-judge.md").write_text(markdown(result))
    print(json.dumps(result["tally"], sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv else None
    if command not in ("manifest", "order", "measure", "cases"):
        return _judge_main(argv)
    p = argparse.ArgumentParser(prog=f"python -m kvsim.calibration.concurrency_judge {command}")
    root_help = "repository root (default: this checkout)"
    if command == "cases":
        a = p.parse_args(argv[1:])
        for c in CASES:
            print(c.name, c.file, c.variant, *c.knobs)
        return 0
    if command == "order":
        p.add_argument("round", type=int)
        p.add_argument("--call-seed", type=int, default=0,
                       help="seeds the orders with the round (0: the round alone, as before)")
        a = p.parse_args(argv[1:])
        if a.round < 1:
            print("concurrency_judge order: ROUND must be >= 1", file=sys.stderr)
            return 2
        print("\n".join(round_order(a.round, a.call_seed)))
        return 0
    p.add_argument("out")
    p.add_argument("--mode", required=True, choices=sorted(MODES))
    p.add_argument("--root", default=None, help=root_help)
    if command == "manifest":
        p.add_argument("--budget-s", type=float, default=None)
    else:
        p.add_argument("--cpu-model", default=SHIPPED_PRESET,
                       help="CPU preset the runs record (the dry run simulates with it)")
        p.add_argument("--round", type=int, required=True)
        p.add_argument("--until", type=float, default=None, help="no run starts after (Unix s)")
        p.add_argument("--hard-end", type=float, default=None, help="a run still going is cut")
        p.add_argument("--run-limit-s", type=float, default=RUN_LIMIT_S)
        p.add_argument("--speed-probe", action="store_true",
                       help="time the churn loop in the run's process before and after each "
                            "run, into its speed.json (for the judge's --run-speed)")
        p.add_argument("cases", nargs="+")
    a = p.parse_args(argv[1:])
    root = Path(a.root) if a.root else default_root()
    try:
        if command == "manifest":
            write_manifest(Path(a.out), a.mode, root, a.budget_s)
            return 0
        cpu = cpu_model_arg(a.cpu_model)
        if a.round < 1:
            raise KvsimError(f"--round {a.round}: must be >= 1")
        measure(Path(a.out), a.round, a.cases, a.mode, cpu, root, a.until, a.hard_end,
                a.run_limit_s, lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}",
                                               file=sys.stderr), a.speed_probe)
    except (KvsimError, OSError, ValueError) as e:
        print(f"concurrency_judge {command}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
