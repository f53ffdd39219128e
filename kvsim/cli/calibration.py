"""``kvsim calibrate`` and ``kvsim validate``: their options. The work is in
:mod:`kvsim.calibration.calibrate` and :mod:`kvsim.calibration.validate`, imported when the
command runs: they bring numpy, the manager and the benchmarks, which building the command line
(``--help``, a usage error) does not need."""

from __future__ import annotations

import argparse

from kvsim.calibration.gil_bench_size import BENCH_PROBES


def _count_of_probes(text: str) -> int:
    """An argparse ``type``: a whole number of probes, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of probes, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"at least 1 probe per thread, got {n}")
    return n


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine; write a CPU cost preset (and a "
                                         "hardware JSON from copy measurements)")
    p.add_argument("--out", default="reports/calibration", help="output directory")
    p.add_argument("--name", default=None, help="CPU preset name (default kvsim-python-<host>)")
    p.add_argument("--repeats", type=int, default=5,
                   help="repeats of each CPU-cost measurement (default 5)")
    p.add_argument("--gil-runs", type=int, default=6,
                   help="runs of the GIL hand-over benchmark per thread count (0: skip it)")
    p.add_argument("--gil-probes", type=_count_of_probes, default=BENCH_PROBES,
                   metavar="N",
                   help="probes per thread of the GIL hand-over benchmark (default "
                        f"{BENCH_PROBES}: fewer leave the threads hardly overlapping "
                        "on a fast manager, and nothing to fit)")
    p.add_argument("--no-gil-fit", action="store_true",
                   help="keep the GIL hand-over as estimated (skip the fit by simulation, "
                        "a few minutes; tools/gil_fields_from_samples.py can do it later)")
    p.add_argument("--measure-copies", action="store_true",
                   help="GPU machine: run the copy benchmarks into --out first, then fit them")
    p.add_argument("--quick-copies", action="store_true",
                   help="with --measure-copies: a smoke run (hw.bench_copy --quick, 0.1 s idle spells)")
    p.add_argument("--copy-measurement", help="hw.bench_copy output to fit a hardware JSON to")
    p.add_argument("--plan-copies", help="hw.bench_plan_copies output (the copier's costs)")
    p.add_argument("--link-wake", help="hw.bench_link_wake output (first copy after idling)")
    p.add_argument("--plan-batches", help="hw.bench_plan_batches output, .json or .json.xz (the "
                                          "copy model refitted on its fit set)")
    p.add_argument("--hardware-name", default=None,
                   help="hardware JSON name (default calibrated-<host>)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_calibrate)


def add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="simulator predictions against hardware-executor runs")
    p.add_argument("scenario", help="the scenario YAML file the measured runs ran")
    p.add_argument("--measured", required=True, action="append",
                   help="a results directory of an hw run of the scenario (repeatable)")
    p.add_argument("--hardware", help="hardware preset or JSON for the simulator")
    p.add_argument("--cpu-model", help="CPU cost preset or JSON for the simulator")
    p.add_argument("--copy-measurement", help="the copy-bench JSON the copy model was fitted to")
    p.add_argument("--out", required=True, help="report directory")
    p.set_defaults(func=_validate)


def _calibrate(args: argparse.Namespace) -> int:
    from kvsim.calibration import calibrate

    return calibrate.run(args)


def _validate(args: argparse.Namespace) -> int:
    from kvsim.calibration import validate

    return validate.run(args)
