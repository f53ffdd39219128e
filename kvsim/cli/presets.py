"""``kvsim presets``: the hardware presets and CPU cost presets, with what their figures came from.

One line per preset: its kind (``hardware`` or ``cpu-cost``), its name (what ``--hardware``,
``hardware:`` or ``cpu_model:`` take), the first sentence of its description, and the documents
its figures cite, most cited first (figures marked as not measured or assumed are counted
apart). ``--json`` prints one object with the full descriptions and every cited document.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter

KINDS = ("hardware", "cpu-cost")
_UNSOURCED = re.compile(r"(?i)^(not |assum)")  # "not measured on this GPU", "assumption"


def add_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the hardware and CPU cost presets and their sources",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=KINDS, help="list only the presets of this kind")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (full descriptions, every source with its count)")
    p.set_defaults(func=run)


def document(source: str) -> str:
    """The document a source string cites: ``"reports/x.json (H200, ...): median of ..."`` ->
    ``"reports/x.json"``."""
    return re.split(r": | \(|; ", source.strip(), maxsplit=1)[0].strip()


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(text.split()), maxsplit=1)[0]


def describe(kind: str, name: str, description: str, sources: dict[str, str], file: str) -> dict:
    cited = Counter(document(s) for s in sources.values() if not _UNSOURCED.match(s.strip()))
    return {"kind": kind, "name": name, "file": file, "description": description,
            "summary": first_sentence(description),
            "sources": [{"document": d, "figures": n}
                        for d, n in sorted(cited.items(), key=lambda kv: (-kv[1], kv[0]))],
            "figures": len(sources),
            "unsourced_figures": sum(1 for s in sources.values() if _UNSOURCED.match(s.strip()))}


def list_presets(kinds: tuple[str, ...] = KINDS) -> tuple[list[dict], list[str]]:
    """Every preset of ``kinds`` described, and an error line for each that does not load."""
    from kvsim.errors import KvsimError
    from kvsim.hardware.spec import PRESET_DIR, load_hardware, preset_names
    from kvsim.model.cpu_cost import CPU_PRESET_DIR, cpu_preset_names, load_cpu_model

    rows, errors = [], []
    for kind, names, load, folder in (("hardware", preset_names, load_hardware, PRESET_DIR),
                                      ("cpu-cost", cpu_preset_names, load_cpu_model,
                                       CPU_PRESET_DIR)):
        if kind not in kinds:
            continue
        for name in names():
            try:
                preset = load(name)
            except KvsimError as e:
                errors.append(str(e))
                continue
            rows.append(describe(kind, preset.name, preset.description, preset.sources,
                                 str(folder / f"{name}.json")))
    return rows, errors


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def run(args: argparse.Namespace) -> int:
    rows, errors = list_presets((args.kind,) if args.kind else KINDS)
    for error in errors:
        print(f"kvsim presets: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps({"presets": rows}, sort_keys=True))
        return 2 if errors else 0
    table = [("KIND", "NAME", "DESCRIPTION", "SOURCES")]
    for r in rows:
        cited = ", ".join(s["document"] for s in r["sources"]) or "-"
        if r["unsourced_figures"]:
            cited += f" (+{r['unsourced_figures']} of {r['figures']} figures not measured/assumed)"
        table.append((r["kind"], r["name"], _clip(r["summary"], 100), cited))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    return 2 if errors else 0
