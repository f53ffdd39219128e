"""The ``kvsim`` command line: one module per command (or group of commands)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kvsim.calibration import calibrate, validate
    from kvsim.cli import bench, copy_model, detect, explore, replay_cache, run
    from kvsim.sweep import cli as sweep_cli

    parser = argparse.ArgumentParser(prog="kvsim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (bench, run, copy_model, explore, detect, replay_cache, sweep_cli, calibrate,
                   validate):
        module.add_parser(sub)
    for command in sub.choices.values():  # so that a command's errors show its own usage
        command.set_defaults(_parser=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
