"""The ``kvsim`` command line: one module per command (or group of commands)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from kvsim.cli import bench, calibration, copy_model, detect, explore, presets, replay_cache, run, tiers
    from kvsim.cli._common import CommandParser, package_version, polish
    from kvsim.sweep import cli as sweep_cli

    parser = argparse.ArgumentParser(prog="kvsim", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvsim {package_version()}",
                        help="print the version of kvsim and exit")
    # CommandParser: a command's own errors (unknown options included) show its own usage.
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=CommandParser,
                                help="one of these (kvsim COMMAND --help for its options)")
    for add_parser in (bench.add_parser, run.add_parser, copy_model.add_parser,
                       explore.add_parser, detect.add_parser, replay_cache.add_parser,
                       sweep_cli.add_parser, calibration.add_calibrate_parser,
                       calibration.add_validate_parser, presets.add_parser, tiers.add_parser):
        add_parser(sub)
    polish(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # before the command (the command's parser rejects its own)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args))


def console_main() -> int:
    """The ``kvsim`` command: :func:`main`, then the process exits without a last collection
    over what the command made (:func:`kvsim.sim.collector.leave_to_exit`)."""
    from kvsim.sim.collector import leave_to_exit

    code = main()
    leave_to_exit()
    return code


if __name__ == "__main__":
    sys.exit(console_main())
