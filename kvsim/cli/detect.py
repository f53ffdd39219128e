"""``kvsim detect``: print the CPU-GPU topology of a device, optionally as a hardware JSON.

    kvsim detect [--json] [--device N] [--write-hardware FILE] [--base-preset NAME]

Prints each detected figure with its source (or one JSON object with ``--json``).
``--write-hardware`` writes a hardware JSON for the simulator: the base preset (default
``h200-sxm``) with the detected link, SM count and copy-engine count. Without CUDA (no CuPy, no
driver, no device) it prints what is missing and exits 1; NVML problems are reported as fallbacks
inside the output, not as failures. Nothing GPU-related is imported until the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def add_parser(sub) -> None:
    p = sub.add_parser("detect", help="detect the CPU-GPU link, SM and copy-engine counts (needs CUDA)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--write-hardware", metavar="FILE",
                   help="also write a hardware JSON usable by the simulator (--hardware FILE)")
    p.add_argument("--base-preset", default="h200-sxm",
                   help="preset whose other figures the written hardware JSON keeps (default h200-sxm)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hw.topology import CudaUnavailableError, detect, to_hardware_json
    from kvsim.errors import KvsimError

    try:
        topo = detect(args.device)
    except CudaUnavailableError as e:
        print(f"kvsim detect: CUDA is not available: {e}", file=sys.stderr)
        return 1
    written = None
    if args.write_hardware:
        try:
            to_hardware_json(topo, args.base_preset, path=args.write_hardware)
        except (KvsimError, OSError, ValueError) as e:
            print(f"kvsim detect: cannot write {args.write_hardware}: {e}", file=sys.stderr)
            return 2
        written = args.write_hardware
    if args.json:
        out = topo.to_dict()
        if written:
            out["hardware_json"] = written
        print(json.dumps(out, sort_keys=True))
    else:
        print("\n".join(topo.summary_lines()))
        if written:
            print(f"wrote {written} (base preset {args.base_preset})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m kvsim.cli.detect``), same options as ``kvsim detect``."""
    from kvsim.cli._common import CommandParser, polish

    parser = argparse.ArgumentParser(prog="kvsim")
    add_parser(parser.add_subparsers(dest="command", required=True, parser_class=CommandParser))
    polish(parser, {})
    args = parser.parse_args(["detect", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
