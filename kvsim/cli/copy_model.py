"""``kvsim copy-model``: predict one copy batch, or one per line of a JSONL file."""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from typing import TYPE_CHECKING

from kvsim.cli._common import byte_size
from kvsim.errors import KvsimError
from kvsim.model.path_names import PATHS
from kvsim.output_dir import OutputDirError, open_output_dir

# The copy model is imported where a command uses it: building the parser needs none of it.
if TYPE_CHECKING:
    from kvsim.hardware import HardwareSpec

FIELDS = ("hardware", "path", "direction", "page_bytes", "pages", "ctas", "inflight_bytes",
          "bidirectional", "aligned")


@lru_cache(maxsize=32)
def _hardware(name: str) -> HardwareSpec:
    from kvsim.hardware import load_hardware

    return load_hardware(name)


def predict(fields: dict) -> dict:
    from kvsim.model.copy_paths import CopyRequest, estimate
    from kvsim.validation import parse_size

    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})")
    if "hardware" not in fields:
        raise ValueError("missing field 'hardware'")
    hw = _hardware(str(fields["hardware"]))
    for key in ("page_bytes", "inflight_bytes"):  # "16 KiB" as in scenario files
        if isinstance(fields.get(key), str):
            try:
                fields = {**fields, key: parse_size(fields[key])}
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
    req = CopyRequest(
        path=fields.get("path", hw.default_path()),
        direction=fields.get("direction", "offload"),
        page_bytes=fields.get("page_bytes", 0),
        pages=fields.get("pages", 0),
        ctas=fields.get("ctas"),
        inflight_bytes=fields.get("inflight_bytes"),
        bidirectional=bool(fields.get("bidirectional", False)),
        aligned=bool(fields.get("aligned", True)),
    )
    out = estimate(hw, req).to_dict()
    out["hardware"] = hw.name
    out["page_bytes"] = req.page_bytes
    out["pages"] = req.pages
    out["bidirectional"] = req.bidirectional
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("copy-model", help="predict the time of one copy batch")
    p.add_argument("--hardware", help="preset name (kvsim presets lists them) or hardware JSON file")
    p.add_argument("--path", choices=PATHS,
                   help="copy path (default: the hardware's: kernel on coherent links, ce-batch "
                        "on PCIe)")
    p.add_argument("--direction", choices=("offload", "onboard"), default="offload",
                   help="offload (GPU to host) or onboard (host to GPU); default offload")
    p.add_argument("--page-bytes", type=byte_size(), metavar="SIZE",
                   help="bytes per page: 16384, '16 KiB', '1 MiB', ...")
    p.add_argument("--pages", type=int, help="pages in the batch")
    p.add_argument("--ctas", type=int,
                   help="kernel path: copy CTAs (default: the hardware's grid policy)")
    p.add_argument("--inflight-bytes", type=byte_size(), metavar="SIZE",
                   help="kernel path: bytes each CTA keeps in flight, e.g. '32 KiB' (default: "
                        "the preset's)")
    p.add_argument("--bidirectional", action="store_true",
                   help="the opposite direction is busy at the same time")
    p.add_argument("--unaligned", action="store_true",
                   help="pages, strides or bases not 16-byte multiples (fallback kernel)")
    p.add_argument("--batch", metavar="FILE.jsonl",
                   help="one request per line (same field names; sizes may be '16 KiB'); one JSON "
                        "result per line")
    p.add_argument("--json", action="store_true", help="print JSON (always on with --batch)")
    p.add_argument("--compare", metavar="MEASUREMENT.json",
                   help="compare the preset with a copy-bench measurement (hw/bench_copy.py)")
    p.add_argument("--out", help="with --compare: report directory (default "
                   "reports/copy-model-<hardware>)")
    p.set_defaults(func=run)


def _run_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kvsim.calibration.copy_compare import write_comparison
    from kvsim.calibration.copy_fit import compare, observations
    from kvsim.hardware import load_hardware

    if not args.hardware:
        print("kvsim copy-model --compare needs --hardware", file=sys.stderr)
        return 2
    try:
        hw = load_hardware(args.hardware)
        out = open_output_dir(args.out or f"reports/copy-model-{hw.name}",
                              "--out" if args.out else "the report directory")
        measurement = json.loads(Path(args.compare).read_text())
        rows = compare(hw, observations(measurement))
    except OutputDirError as e:
        print(f"kvsim copy-model: {e}", file=sys.stderr)
        return 2
    except (KvsimError, OSError, ValueError, KeyError) as e:
        print(f"kvsim copy-model: {args.compare}: {e}", file=sys.stderr)
        return 2
    stats = write_comparison(hw, rows, args.compare, out)
    print(json.dumps({"hardware": hw.name, "report": str(out / "README.md"), **stats},
                     sort_keys=True))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.compare:
        return _run_compare(args)
    if args.batch:
        return _run_batch(args.batch)
    if not args.hardware or args.page_bytes is None or args.pages is None:
        print("kvsim copy-model: --hardware, --page-bytes and --pages are required "
              "(or --batch FILE)", file=sys.stderr)
        return 2
    fields = {"hardware": args.hardware, "direction": args.direction,
              "page_bytes": args.page_bytes, "pages": args.pages,
              "bidirectional": args.bidirectional, "aligned": not args.unaligned}
    for key in ("path", "ctas", "inflight_bytes"):
        if getattr(args, key) is not None:
            fields[key] = getattr(args, key)
    try:
        out = predict(fields)
    except (KvsimError, ValueError) as e:
        print(f"kvsim copy-model: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"{out['path']} {out['direction']} on {out['hardware']}: {out['pages']} x "
              f"{out['page_bytes']} B in {out['seconds'] * 1e3:.4f} ms = {out['gbps']:.2f} GB/s"
              + (f", {out['ctas']} CTAs" if out["ctas"] else "")
              + f"; host submission {out['host_seconds'] * 1e6:.1f} us")
    return 0


def _run_batch(path: str) -> int:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        print(f"kvsim copy-model: {path}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 2
    failed = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            fields = json.loads(line)
            if not isinstance(fields, dict):
                raise ValueError("each line must be a JSON object")
            out = predict(fields)
        except (KvsimError, ValueError) as e:
            failed += 1
            out = {"error": f"{path}:{number}: {e}"}
            print(f"kvsim copy-model: {path}:{number}: {e}", file=sys.stderr)
        print(json.dumps(out, sort_keys=True))
    return 1 if failed else 0
