"""The issue-5 copy-path table from a copy-bench measurement: GB/s per path, direction and page
size (batches of ~100 MB or 256 MB), next to the contiguous copy-engine plateau of the same run,
and the path kvsim.model.copy_select picks for that batch with its measured rate as a share of the plateau.

Usage: python tools/copy_path_table.py MEASUREMENT.json [total|device] > TABLE.md
(total: the selector minimises device + host submission time; device: device time alone)
"""

import json
import sys

from kvsim.hardware import load_hardware
from kvsim.model.copy_select import CopySelector

meas = json.load(open(sys.argv[1]))
hw = load_hardware("h200-sxm")
sel = CopySelector(hw, objective=sys.argv[2] if len(sys.argv) > 2 else "total")
name_dir = {"host_to_device": "onboard", "device_to_host": "offload"}
plateau = {d: max(r["median_gbs"] for r in meas["records"] if r["section"] == "contiguous_ce"
                  and r["name"].startswith(n) and "bidirectional" not in r["name"]
                  and r["params"]["copy_bytes"] >= 64 << 20)
           for n, d in name_dir.items()}
rows = {}
for r in meas["records"]:
    d = next((v for k, v in name_dir.items() if r["name"].startswith(k)), None)
    if d is None or r["timing"] != "cuda_events_gated":
        continue
    p = r["params"]
    if r["section"] == "paged_ce":
        path = "ce-batch" if "batch" in r["name"] else "ce-page"
    elif r["section"] == "kernel_page_sweep":
        path = f"kernel {p['ctas']} CTAs"
    else:
        continue
    rows.setdefault((d, p["page_bytes"]), {})[path] = r["median_gbs"]
print(f"# Copy paths on the H200: GB/s by page size ({sys.argv[1]})\n")
print(f"Selector objective: {sel.objective}.\n")
print("GB/s = 1e9 B/s, medians of 9 samples, CUDA events around the copies (gated: device time).")
print("Copy-engine rows time the first 256 (per page) or 4096 (batched) pages of ~96 MiB batches;")
print("kernel rows 256 MiB batches at 64 KiB in flight per CTA. Plateau: contiguous cudaMemcpyAsync")
print(f"of >= 64 MiB in the same run: offload {plateau['offload']:.2f}, onboard {plateau['onboard']:.2f}.\n")
print("| direction | page | ce-page | ce-batch | kernel 8 CTAs | kernel 32 CTAs | selected (model) | "
      "selected measured | % of plateau | target | met |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (d, pb), paths in sorted(rows.items()):
    pages = max(1, (100 << 20) // pb)
    choice = sel.choose(d, (pb,), pages)
    picked = choice.path if choice.path != "kernel" else f"kernel {choice.estimate.ctas} CTAs"
    measured = paths.get(picked)
    if measured is None and choice.path == "kernel":  # nearest measured CTA count
        near = min((8, 32), key=lambda c: abs(c - (choice.estimate.ctas or 8)))
        measured = paths.get(f"kernel {near} CTAs")
        picked += f" (measured at {near})"
    share = measured / plateau[d] * 100 if measured else None
    target = 90 if pb == 16 << 10 else (95 if pb >= 256 << 10 else None)
    met = "-" if target is None or share is None else ("yes" if share >= target else "no")
    size = f"{pb >> 20} MiB" if pb >= 1 << 20 else f"{pb >> 10} KiB"
    cell = lambda k, paths=paths: f"{paths[k]:.2f}" if k in paths else "-"  # noqa: E731
    print(f"| {d} | {size} | {cell('ce-page')} | {cell('ce-batch')} | {cell('kernel 8 CTAs')} | "
          f"{cell('kernel 32 CTAs')} | {picked} | {measured:.2f} | {share:.1f} % | "
          f"{target or '-'}{' %' if target else ''} | {met} |")
