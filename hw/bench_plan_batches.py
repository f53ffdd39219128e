"""Plan-shaped copy batches on every path the selector can pick: held-out data for the copy model.

Usage (the batch list needs the simulator; on a GPU machine without SimPy, write it elsewhere
with ``python -m kvsim.calibration.plan_batches list --json LIST.json`` and pass ``--batches``)::

    python3 -m hw.bench_plan_batches --out DIR [--quick] [--budget-s S] [--dry-run]
                                     [--batches LIST.json] [--hardware h200-sxm] [--device N]

Writes ``DIR/<YYYY-MM-DD>-plan-batches.json`` (UTC date): provenance, the batch list, every raw
sample, and the pre-registered split. Judge it with
``python -m kvsim.calibration.plan_batches judge DIR/<date>-plan-batches.json`` (no GPU needed);
``reports/validation-h200/plan-batches/PROTOCOL.md`` states the split and the targets.
Exit status 1 when a data check failed or a group of batches raised.

**The batches.** The list (schema ``kvsim-plan-batch-list/1``) comes from
``python -m kvsim.calibration.plan_batches list --json FILE`` -- run here in a subprocess unless
``--batches`` names a file (the bench is in ``hw``, which must not import ``kvsim.calibration``;
docs/ARCHITECTURE.md). It holds (a) the copy batches of the shipped sim/plan scenarios' manager
plans (real slot arrays; one batch per distinct (direction, pool slot sizes, pages), page counts
binned by powers of two where a scenario makes more than 16 of them), (b) the seed burst's shape
on scattered slots, (c) a layout sweep (6 pool layouts x up to 5 page counts x scattered / sorted
slots x offload / onboard). Every batch says its direction, pool slot sizes, page count, slot
arrays (explicitly, or as a seed: :func:`slot_arrays` rebuilds them) and pool sizes.

Every measurement states what it moves and how it is timed (nvbandwidth style):

* **Buffers.** Per pool layout, :class:`hw.pools.HostDevicePools` -- the hardware executor's
  pools, laid out as the manager lays slots out: level 0 ``cudaMalloc``, level 1 pinned *mapped*
  host memory (``cudaHostAlloc(n, cudaHostAllocMapped)``); one buffer per pool of the group.
  Offload copies device -> host, onboard host -> device.
* **Paths.** Through :class:`hw.executor_copies.PlanCopier` (what ``kvsim run`` with ``executor: hw``
  submits): ``ce-page`` (one ``cudaMemcpyAsync`` per page and pool), ``ce-batch`` (one
  ``cudaMemcpyBatchAsync`` for the batch), ``kernel`` (the LDGSTS kernel, one launch per pool,
  the preset's bytes in flight per CTA) at 1, 2, 4, 8, 16, 32, 64 and 132 CTAs plus every CTA
  count :class:`kvsim.model.copy_select.CopySelector` considers for the batch, and ``select``
  (PlanCopier with the selector choosing, its pricing included).
* **Timing.** :meth:`hw.bench_copy.Bench.measure`: warm-up samples (discarded), then timed samples,
  median reported, every sample kept. How many (:func:`sample_plan`): points the model prices under
  1 ms end to end take ``--small-samples`` (21), under 10 ms ``--mid-samples`` (7), each in 3
  passes over the batch's points with one warm-up per pass (so the points of a batch share the
  host's slow and fast spells); longer points ``--samples`` (5) after one warm-up.
  ``cuda_events_issue`` (every point, the primary figure): CUDA events on the idle copy stream
  around the submission, so they bracket the host's submission *and* the copy (what a caller that
  submits and waits sees; what the executor's ``BatchRecord.device_s`` measures).
  ``cuda_events_gated`` (where the driver's command queue takes the whole batch while the stream is
  held: kernel always, ``ce-batch`` up to 4096 copies, ``ce-page`` up to 256): a one-thread gate
  kernel holds the stream while the host submits, so the events bracket device execution only.
  ``host_enqueue_ms``: ``perf_counter`` around the submission. GB/s = 1e9 bytes/s of payload, one
  direction.
* **Check.** Source pages hold a per-(slot, pool, byte) signature (:meth:`HostDevicePools.fill_signature`);
  destination pools are poisoned with 0xA5. Each point's destination slots are poisoned before it
  runs; after it every destination page is compared with the signature of the source page it came
  from (:meth:`HostDevicePools.verify`), and guard slots (each destination slot's untouched
  neighbours plus up to 1024 random untouched slots) must still hold the poison; then the
  destination slots are poisoned again. A point measured in passes is checked after its first
  pass; its destination slots are poisoned again after every later pass.
* **Host probe.** Before every pass over a batch's points and once after its last pass, the same
  small batch -- 64 pages of 2 x 8 KiB, offload, slots 0-63 of a probe pool set of its own (256
  slots per level) -- is submitted through :class:`hw.executor_copies.PlanCopier` on each path
  (``ce-page``, ``ce-batch``, ``kernel`` at 8 CTAs), one warm-up and :data:`PROBE_REPS` timed
  submissions each, the stream synchronised after each; the median host enqueue time
  (``perf_counter`` around the submission) per path is recorded under ``host_probes`` with the
  batch and pass it preceded. It tracks the host's speed through the run (about 15 ms a probe);
  the judge scales each path's host figures by it (PROTOCOL-3.md). ``--no-host-probe`` leaves it out.
* **Records.** Compact unless ``--full-records`` (:meth:`PlanBench.add`): times rounded to 0.1 us,
  per-sample GB/s, host total time and the copier's own event times left out.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
import traceback
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hw.bench_copy import (
    GATED_BATCH_MAX,
    GATED_PERPAGE_MAX,
    POISON,
    Bench,
    nvml_snapshot,
    provenance,
    write_doc,
)

REPO = Path(__file__).resolve().parents[1]
LIST_SCHEMA = "kvsim-plan-batch-list/1"
SCHEMA = "kvsim-plan-batches/1"
BASE_CTAS = (1, 2, 4, 8, 16, 32, 64, 132)
QUICK_CTAS = (2, 8, 32)
FIXED_PATHS = ("ce-page", "ce-batch", "kernel")
SELECT = "select"
DEVICE, HOST = 0, 1
LEVEL_OF = {"offload": (DEVICE, HOST), "onboard": (HOST, DEVICE)}
GUARD_SAMPLE = 1024
# Dry-run estimate terms (seconds): per timed run beyond the model's time (events, Python, sync),
# per point (slot upload, poison, verify set-up), verification and poisoning rates, per pool set
# (allocation, warm-up), and the first kernel compilation (NVRTC).
EST_RUN_S = 0.3e-3
EST_POINT_S = 6e-3
EST_VERIFY_GBPS = 12.0
EST_FILL_GBPS = 8.0
EST_GROUP_S = 1.5
EST_COMPILE_S = 8.0
EST_PIN_S_PER_GB = 0.4
EST_PROBE_S = 15e-3  # one host probe (three paths, PROBE_REPS + 1 submissions each)


# ---------------------------------------------------------------------------- slot arrays (no GPU)

def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hashed_choice(seed: int, pool_slots: int, n: int) -> np.ndarray:
    """``n`` distinct slots of ``range(pool_slots)`` in a seeded random order: the first ``n`` of
    the permutation that sorts ``splitmix64(slot ^ splitmix64(seed))``. Pure integer arithmetic,
    so the same on every machine and NumPy version."""
    if not 0 <= n <= pool_slots:
        raise ValueError(f"cannot choose {n} distinct slots of {pool_slots}")
    key = _splitmix64(np.array([seed], dtype=np.uint64))[0]
    order = np.argsort(_splitmix64(np.arange(pool_slots, dtype=np.uint64) ^ key), kind="stable")
    return order[:n].astype(np.int32)


def encode_slots(slots: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.ascontiguousarray(slots, dtype="<i4").tobytes(), 6)).decode()


def decode_slots(text: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<i4").astype(np.int32)


def slot_arrays(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """(src_slots, dst_slots) of one batch description of the list."""
    s, n = batch["slots"], int(batch["pages"])
    src_level, dst_level = LEVEL_OF[batch["direction"]]
    pools = (batch["pool_slots"]["device"], batch["pool_slots"]["host"])
    if s["kind"] == "sorted":
        src = dst = np.arange(n, dtype=np.int32)
    elif s["kind"] == "hashed_choice":
        src = hashed_choice(int(s["src_seed"]), int(pools[src_level]), n)
        dst = hashed_choice(int(s["dst_seed"]), int(pools[dst_level]), n)
    elif s["kind"] == "explicit":
        src, dst = decode_slots(s["src"]), decode_slots(s["dst"])
    else:
        raise ValueError(f"batch {batch.get('id')}: unknown slot kind {s['kind']!r}")
    if src.size != n or dst.size != n:
        raise ValueError(f"batch {batch.get('id')}: {src.size} / {dst.size} slots for {n} pages")
    return src, dst.copy() if dst is src else dst


# ---------------------------------------------------------------------------- the plan (no GPU)

def load_list(path: str | None, quick: bool) -> dict:
    """The batch list: from ``path``, or generated by kvsim.calibration.plan_batches (subprocess)."""
    if path:
        doc = json.loads(Path(path).read_text())
    else:
        cmd = [sys.executable, "-m", "kvsim.calibration.plan_batches", "list", "--json", "-"]
        if quick:
            cmd.append("--quick")
        print(f"generating the batch list: {' '.join(cmd[1:])} (runs the shipped scenarios)",
              file=sys.stderr, flush=True)
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(
                f"the batch list could not be generated here (it runs the shipped scenarios on the "
                f"simulator, which needs SimPy):\n{out.stderr[-2000:]}\nGenerate it on a machine "
                f"with the simulator: python -m kvsim.calibration.plan_batches list --json FILE "
                f"(add --quick for the quick list), then pass --batches FILE")
        doc = json.loads(out.stdout)
    if doc.get("schema") != LIST_SCHEMA:
        raise ValueError(f"batch list schema {doc.get('schema')!r}, expected {LIST_SCHEMA!r}")
    return doc


def cta_counts(hw: Any, batch: dict, quick: bool = False) -> list[int]:
    """Kernel CTA counts measured for ``batch``: the base grid plus what the selector considers."""
    from kvsim.model.copy_select import CopySelector

    opts = CopySelector(hw).kernel_cta_options()
    base = QUICK_CTAS if quick else BASE_CTAS
    return sorted(c for c in set(base) | set(opts) if c <= hw.kernel.sm_count)


def points(hw: Any, batch: dict, quick: bool = False,
           select_only: bool = False) -> list[tuple[str, int | None]]:
    """(path, ctas) measured for one batch; ``select`` last. ``select_only``: the selector's
    pick as a fixed point, then ``select`` (a re-measurement of a changed selector)."""
    if select_only:
        return [selector_pick(hw, batch), (SELECT, None)]
    out: list[tuple[str, int | None]] = [("ce-page", None), ("ce-batch", None)]
    out += [("kernel", c) for c in cta_counts(hw, batch, quick)]
    return out + [(SELECT, None)]


def selector_pick(hw: Any, batch: dict) -> tuple[str, int | None]:
    from kvsim.model.copy_select import CopySelector

    sel = CopySelector(hw).choose(batch["direction"], batch["pool_slot_bytes"], int(batch["pages"]))
    return sel.path, (sel.estimate.ctas if sel.path == "kernel" else None)


# The host probe (PlanBench.host_probe; PROTOCOL-3.md): a batch small enough that a probe of the
# three paths takes about 15 ms, so one before every pass of 147 batches costs about 10 s of a run.
PROBE_PAGES = 64
PROBE_SLOTS = 256
PROBE_REPS = 5
PROBE_LAYOUT = (8192, 8192)
PROBE_POINTS = (("ce-page", None), ("ce-batch", None), ("kernel", 8))

SMALL_POINT_S = 1e-3   # points the model prices below this end to end take --small-samples
MID_POINT_S = 10e-3    # ... below this --mid-samples; both in ROUNDS passes (run_batch)
ROUNDS = 3


def sample_plan(hw: Any, batch: dict, path: str, ctas: int | None, samples: int,
                small_samples: int | None, mid_samples: int | None) -> tuple[int, int]:
    """``(timed samples, rounds)`` of one point: :func:`samples_for` its end-to-end time as the
    model prices it."""
    from kvsim.model.copy_select import CopySelector

    sel = CopySelector(hw)
    layout, pages, d = batch["pool_slot_bytes"], int(batch["pages"]), batch["direction"]
    if path == SELECT:
        est = sel.choose(d, layout, pages).estimate
    else:
        est = sel.price(path, d, layout, pages, True, ctas)
    return samples_for(est.end_to_end_seconds, samples, small_samples, mid_samples)


def samples_for(seconds: float, samples: int, small_samples: int | None,
                mid_samples: int | None) -> tuple[int, int]:
    """``(timed samples, rounds)`` of a point the model prices at ``seconds`` end to end:
    sub-millisecond points take ``small_samples``, points under 10 ms ``mid_samples``, both in
    :data:`ROUNDS` passes; longer points ``samples`` in one pass. None: ``samples``, one pass
    (the 2026-12-03 protocol)."""
    if small_samples and seconds < SMALL_POINT_S:
        return max(samples, small_samples), ROUNDS
    if mid_samples and seconds < MID_POINT_S:
        return max(samples, mid_samples), ROUNDS
    return samples, 1


def copies_of(batch: dict, path: str) -> int:
    """Copy calls / descriptors the path enqueues for the batch."""
    npools = len(batch["pool_slot_bytes"])
    return npools if path == "kernel" else npools * int(batch["pages"])


def gateable(batch: dict, path: str) -> bool:
    if path == "kernel":
        return True
    limit = GATED_BATCH_MAX if path == "ce-batch" else GATED_PERPAGE_MAX
    return copies_of(batch, path) <= limit


def pool_key(batch: dict) -> tuple:
    return (tuple(batch["pool_slot_bytes"]), int(batch["pool_slots"]["device"]),
            int(batch["pool_slots"]["host"]))


def groups(batches: Sequence[dict]) -> list[tuple[tuple, list[dict]]]:
    """Batches by pool set (slot sizes, device slots, host slots), in first-seen order."""
    out: dict[tuple, list[dict]] = {}
    for b in batches:
        out.setdefault(pool_key(b), []).append(b)
    return list(out.items())


def estimate_point_s(hw: Any, batch: dict, path: str, ctas: int | None, warmup: int,
                     samples: int, small: int | None = None, mid: int | None = None) -> float:
    """Estimated wall seconds of one point: the model's submit + copy time per run, plus the
    bench's own costs (see the ``EST_`` constants)."""
    from kvsim.model.copy_select import CopySelector

    sel = CopySelector(hw)
    layout, pages, d = batch["pool_slot_bytes"], int(batch["pages"]), batch["direction"]
    if path == SELECT:
        choice = sel.choose(d, layout, pages)
        est, real = choice.estimate, choice.path
    else:
        est, real = sel.price(path, d, layout, pages, True, ctas), path
    run = est.end_to_end_seconds + EST_RUN_S
    n, rounds = samples_for(est.end_to_end_seconds, samples, small, mid)
    runs = warmup * rounds + n
    if gateable(batch, real):
        runs *= 2
    nbytes = pages * sum(layout)
    return runs * run + EST_POINT_S + nbytes / (EST_VERIFY_GBPS * 1e9) \
        + (1 + rounds) * nbytes / (EST_FILL_GBPS * 1e9 * 4)


def estimate_group_s(key: tuple) -> float:
    shape, dev, host = key
    pool_bytes = sum(shape) * (dev + host)
    return EST_GROUP_S + 2 * pool_bytes / (EST_FILL_GBPS * 1e9) \
        + sum(shape) * host / 1e9 * EST_PIN_S_PER_GB


def plan_table(hw: Any, batches: Sequence[dict], quick: bool, warmup: int,
               samples: int, select_only: bool = False, small: int | None = None,
               mid: int | None = None, probe: bool = False) -> tuple[list[dict], float]:
    rows, total = [], EST_COMPILE_S
    for key, grp in groups(batches):
        total += estimate_group_s(key)
        for b in grp:
            pts = points(hw, b, quick, select_only)
            secs = sum(estimate_point_s(hw, b, p, c, warmup, samples, small, mid) for p, c in pts)
            if probe:  # one probe before each pass and one after the last
                secs += EST_PROBE_S * (1 + max(sample_plan(hw, b, p, c, samples, small, mid)[1]
                                               for p, c in pts))
            total += secs
            rows.append({"id": b["id"], "role": b["role"], "direction": b["direction"],
                         "pool_slot_bytes": b["pool_slot_bytes"], "pages": b["pages"],
                         "bytes": b["bytes"], "order": b["order"],
                         "paths": [p if c is None else f"{p}:{c}" for p, c in pts],
                         "gated": [p for p, _ in pts if p != SELECT and gateable(b, p)],
                         "estimated_s": secs})
    return rows, total


def print_plan(rows: list[dict], total: float, groups_n: int) -> None:
    print(f"{'batch':<48} {'role':<6} {'MiB':>9} {'points':>6} {'est s':>7}  paths")
    for r in rows:
        paths = sorted({p.split(":")[0] for p in r["paths"]})
        ctas = [p.split(":")[1] for p in r["paths"] if ":" in p]
        print(f"{r['id']:<48} {r['role']:<6} {r['bytes'] / 2**20:9.2f} {len(r['paths']):6d} "
              f"{r['estimated_s']:7.2f}  {'+'.join(paths)} (kernel CTAs {','.join(ctas)})")
    nbytes = sum(r["bytes"] for r in rows)
    npts = sum(len(r["paths"]) for r in rows)
    print(f"\n{len(rows)} batches ({sum(r['role'] == 'fit' for r in rows)} fit, "
          f"{sum(r['role'] == 'judge' for r in rows)} judged), {npts} points, {groups_n} pool sets, "
          f"{nbytes / 1e9:.2f} GB per pass over the batches; estimated GPU run time {total:.0f} s "
          f"({total / 60:.1f} min)", flush=True)


# ---------------------------------------------------------------------------- the GPU run

def layout_for(shape: Sequence[int], device_slots: int, host_slots: int) -> Any:
    """A one-group manager layout with these pool slot sizes and slot counts per level."""
    from kvsim.manager import LayerConfig, LevelConfig, ManagerConfig
    from kvsim.manager.config import StorageLayout

    page = sum(shape)
    cfg = ManagerConfig(layers=(LayerConfig(slot_bytes=tuple(int(s) for s in shape)),),
                        levels=(LevelConfig("gpu", device_slots * page),
                                LevelConfig("host", host_slots * page)), tokens_per_block=32)
    return StorageLayout.from_config(cfg)


def block_ids(level: int, slots: np.ndarray) -> np.ndarray:
    """Signature id of (level, slot): distinct per level, so a page read from the wrong tier shows."""
    return np.asarray(slots, dtype=np.int64) * 2 + level


def guard_slots(dst: np.ndarray, num_slots: int, rng: np.random.Generator) -> np.ndarray:
    """Untouched destination slots to check for poison: untouched neighbours of destination
    slots (all of them, or GUARD_SAMPLE drawn at random when there are more), and up to
    GUARD_SAMPLE other untouched slots drawn at random."""
    dst = np.asarray(dst, dtype=np.int64)
    touched = np.zeros(num_slots, dtype=bool)
    touched[dst] = True
    near = np.unique(np.concatenate([dst - 1, dst + 1]))
    near = near[(near >= 0) & (near < num_slots)]
    near = near[~touched[near]]
    if near.size > GUARD_SAMPLE:
        near = rng.choice(near, GUARD_SAMPLE, replace=False)
    free = np.flatnonzero(~touched)
    if free.size > GUARD_SAMPLE:
        free = rng.choice(free, GUARD_SAMPLE, replace=False)
    return np.unique(np.concatenate([near, free])).astype(np.int64)


class PlanBench(Bench):
    """:class:`hw.bench_copy.Bench`'s timing, records and checks, without its 512 MiB buffers:
    the pools here are :class:`hw.pools.HostDevicePools`, one set per pool layout."""

    def __init__(self, args: argparse.Namespace, hardware: Any) -> None:  # noqa: D401
        import cupy

        from hw import copy_engine, copy_kernels

        self.cp, self.np, self.ce, self.ck = cupy, np, copy_engine, copy_kernels
        self.args = args
        self.hw = hardware
        self.quick = bool(args.quick)
        self.select_only = bool(args.select_only)
        self.dev = int(args.device)
        self.t_start = time.perf_counter()
        self.deadline = self.t_start + float(args.budget_s)
        self.records: list[dict] = []
        self.problems: list[str] = []
        self.skipped: list[str] = []
        self.failed_checks = 0
        self.section_errors = 0
        self.rng = np.random.default_rng(args.seed)
        self.warmup = int(args.warmup)
        self.samples = self.base_samples = int(args.samples)
        self.small_samples = args.small_samples or None
        self.mid_samples = args.mid_samples or None
        self.full_records = bool(args.full_records)
        cupy.cuda.Device(self.dev).use()
        self._host_ptrs: list[int] = []
        self.gate_ptr = self._host_alloc(4096)
        import ctypes

        self.gate = np.ctypeslib.as_array((ctypes.c_int32 * 2).from_address(self.gate_ptr))
        self.gate[:] = 0
        self.s1 = cupy.cuda.Stream(non_blocking=True)
        copy_kernels.get_kernel(copy_kernels.GATE)
        self.on_batch: Any = None  # called after each batch (the driver saves the JSON)
        self.no_gate: set[str] = set()  # paths whose gated timing overflowed the command queue
        self.host_probes: list[dict] = []
        self._probe: Any = None if getattr(args, "host_probe", True) else False

    # -- the host probe --------------------------------------------------------------------------
    def host_probe(self, batch_id: str, where: str) -> dict | None:
        """Submit the probe batch on each path of :data:`PROBE_POINTS` (module doc, "Host
        probe"); record and return the median host enqueue ms per path."""
        if self._probe is False:
            return None
        try:
            return self._host_probe(batch_id, where)
        except Exception as exc:  # the probe must not cost the measurement: stop probing
            self.problems.append(f"host probe at {batch_id} {where} failed ({type(exc).__name__}: "
                                 f"{exc}); no more probes in this run")
            self._probe = False
            return None

    def _host_probe(self, batch_id: str, where: str) -> dict:
        from hw.executor_copies import PlanCopier
        from hw.pools import HostDevicePools
        from kvsim.manager.plan import CopyBatch

        if self._probe is None:
            pools = HostDevicePools(layout_for(PROBE_LAYOUT, PROBE_SLOTS, PROBE_SLOTS),
                                    device=self.dev, hardware=self.hw)
            stream = self.cp.cuda.Stream(non_blocking=True)
            slots = np.arange(PROBE_PAGES, dtype=np.int32)
            batch = CopyBatch(DEVICE, HOST, 0, slots, slots.copy(), PROBE_LAYOUT)
            copiers = [(f"{p}" if c is None else f"{p}:{c}",
                        PlanCopier(pools, path=p, stream=stream, ctas=c)) for p, c in PROBE_POINTS]
            self._probe = (pools, batch, copiers)
        _pools, batch, copiers = self._probe
        out: dict[str, Any] = {"batch": batch_id, "at": where,
                               "t_s": round(time.perf_counter() - self.t_start, 3), "ms": {},
                               "samples_ms": {}}
        for key, copier in copiers:
            times = []
            for i in range(1 + PROBE_REPS):
                t0 = time.perf_counter()
                copier.submit([batch])
                t1 = time.perf_counter()
                copier.wait()
                if i:
                    times.append(round((t1 - t0) * 1e3, 4))
            out["samples_ms"][key] = times
            out["ms"][key] = float(np.median(times))
        self.host_probes.append(out)
        return out

    def close(self) -> None:
        if self._probe:
            self._probe[0].close()
            self._probe = None
        super().close()

    # -- one pool set ----------------------------------------------------------------------------
    def run_group(self, key: tuple, batches: list[dict]) -> None:
        from hw.copier import PoolCopier
        from hw.pools import HostDevicePools, InsufficientMemoryError, memory_need, plan_pools

        shape, dev_slots, host_slots = key
        layout = layout_for(shape, dev_slots, host_slots)
        try:
            pools = HostDevicePools(layout, device=self.dev, hardware=self.hw)
        except InsufficientMemoryError as exc:
            # MemAvailable under-reports on VMs whose memory grows as it is used (hw/pools.py);
            # retry when the machine's physical memory is at least twice the pinned need.
            need = memory_need(plan_pools(layout))["host"]
            phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if "host level" not in str(exc) or phys < 2 * need:
                raise
            self.problems.append(f"pool set {key}: {exc}; retried with host_available = "
                                 f"{need} (physical memory {phys} bytes)")
            pools = HostDevicePools(layout, device=self.dev, hardware=self.hw,
                                    host_available=need)
        try:
            # compiles the kernels, creates the batch-copy handle, grows CuPy's pool (slot 0)
            PoolCopier(pools, self.hw, path="auto").warm_up()
            for direction in ("offload", "onboard"):
                todo = [b for b in batches if b["direction"] == direction]
                if not todo:
                    continue
                src_level, dst_level = LEVEL_OF[direction]
                arrays = [slot_arrays(b) for b in todo]
                used = np.unique(np.concatenate([a[0] for a in arrays]))
                pools.fill_signature(src_level, 0, used, block_ids(src_level, used))
                for p in range(len(shape)):
                    pools.view(dst_level, 0, p).fill(POISON)
                self.cp.cuda.runtime.deviceSynchronize()
                for b, (src, dst) in zip(todo, arrays):
                    self.run_batch(pools, b, src, dst)
                    if self.on_batch is not None:
                        self.on_batch()
        finally:
            pools.close()
            self.cp.get_default_memory_pool().free_all_blocks()

    def _poison_slots(self, pools: Any, level: int, slots: Any) -> None:
        for p in range(pools.num_pools(0)):
            pools.view(level, 0, p)[slots] = POISON
        self.cp.cuda.runtime.deviceSynchronize()

    def _check(self, pools: Any, batch: dict, src: np.ndarray, dst: np.ndarray,
               guards: Any) -> tuple[bool, str]:
        src_level, dst_level = LEVEL_OF[batch["direction"]]
        res = pools.verify(dst_level, 0, dst, block_ids(src_level, src))
        clobbered = 0
        for p in range(pools.num_pools(0)):
            view = pools.view(dst_level, 0, p)
            step = max(1, (64 << 20) // view.shape[1])  # bound the gather's temporary memory
            for k in range(0, int(guards.size), step):
                clobbered += int(self.cp.count_nonzero(
                    self.cp.any(view[guards[k:k + step]] != POISON, axis=1)))
        self.cp.get_default_memory_pool().free_all_blocks()
        ok = res.ok and clobbered == 0
        detail = (f"{res.pages} pages x {pools.num_pools(0)} pools compared with their source "
                  f"signature, {res.num_bad} (page, pool) wrong; {int(guards.size)} guard slots, "
                  f"{clobbered} (slot, pool) overwritten")
        if res.bad:
            detail += f"; first bad (slot, block, pool, bytes): {list(res.bad[:4])}"
        return ok, detail

    def run_batch(self, pools: Any, batch: dict, src: np.ndarray, dst: np.ndarray) -> None:
        """Every point of ``batch``. A point's timed samples (:func:`sample_plan`) are taken in
        ``rounds`` passes over the batch's points, each pass opening with one warm-up run per
        point, so that the points of one batch share the host's slow and fast spells alike. Each
        point's data is checked after its first pass (destination poisoned before, checked,
        poisoned again); every later pass poisons the destination slots again after it."""
        from hw.executor_copies import PlanCopier
        from kvsim.manager.plan import CopyBatch
        from kvsim.model.copy_select import CopySelector

        cp = self.cp
        src_level, dst_level = LEVEL_OF[batch["direction"]]
        shape = tuple(batch["pool_slot_bytes"])
        cbatch = CopyBatch(src_level, dst_level, 0, src, dst, shape)
        n_dst = pools.spec(dst_level, 0, 0).num_slots
        guards = cp.asarray(guard_slots(dst, n_dst, self.rng))
        d_dst = cp.asarray(dst.astype(np.int64))
        nbytes = cbatch.num_bytes
        sk, dk = ("device", "host") if batch["direction"] == "offload" else ("host", "device")
        pick = selector_pick(self.hw, batch)
        params = {"batch_id": batch["id"], "source": batch["source"], "role": batch["role"],
                  "direction": batch["direction"], "pool_slot_bytes": list(shape),
                  "pages": int(batch["pages"]), "page_bytes": int(sum(shape)),
                  "order": batch["order"], "pool_slots": batch["pool_slots"]}
        todo = []
        for path, ctas in points(self.hw, batch, self.quick, self.select_only):
            label = f"{batch['id']} {path}{'' if ctas is None else f' {ctas} CTAs'}"
            if self.time_left() < 0:
                self.skip(label)
                continue
            if path == SELECT:
                copier = PlanCopier(pools, selector=CopySelector(self.hw), stream=self.s1)
                real = pick[0]
            else:
                copier = PlanCopier(pools, path=path, stream=self.s1, ctas=ctas)
                real = path
            samples, rounds = sample_plan(self.hw, batch, path, ctas, self.samples,
                                          self.small_samples, self.mid_samples)
            todo.append({"path": path, "ctas": ctas, "label": label, "copier": copier, "real": real,
                         "subs": [], "samples": samples, "rounds": rounds, "meas": {},
                         "copier_ms": {}, "check": None})
        if not todo:
            return
        for rnd in range(max(t["rounds"] for t in todo)):
            self.host_probe(batch["id"], f"pass {rnd}")
            for t in todo:
                if rnd >= t["rounds"]:
                    continue
                n = t["samples"] // t["rounds"] + (1 if rnd < t["samples"] % t["rounds"] else 0)
                copier, subs, real = t["copier"], t["subs"], t["real"]

                def fn(copier: Any = copier, subs: list = subs) -> None:
                    subs.extend(copier.submit([cbatch]))

                self._poison_slots(pools, dst_level, d_dst)
                gate = gateable(batch, real) and real not in self.no_gate
                timings = [("issue", False)] + ([("gated", True)] if gate else [])
                if rnd == 0:
                    t["timings"] = [name for name, _ in timings]
                for tname, gated in timings:
                    if tname not in t["timings"]:
                        continue
                    subs.clear()
                    self.samples = n  # Bench.measure takes warm-up + self.samples runs
                    m = self.measure([(self.s1, fn)], gated=gated)
                    copier.wait()
                    if m.get("gate_overflow"):
                        self.no_gate.add(real)
                        t["timings"].remove(tname)
                        t["meas"].pop(tname, None)
                        self.problems.append(f"{t['label']}: the gate overflowed; no more gated "
                                             f"timing of path {real} in this run")
                        if rnd == 0:
                            t["meas"][tname] = m  # recorded as gate_overflow
                        continue
                    acc = t["meas"].setdefault(tname, {k: [] for k in
                                                       ("stream_ms", "aggregate_ms", "host_enqueue_ms",
                                                        "host_total_ms", "gate_timed_out")})
                    acc["stream_ms"] = [a + b for a, b in zip(acc["stream_ms"] or [[]], m["stream_ms"])]
                    for k in ("aggregate_ms", "host_enqueue_ms", "host_total_ms", "gate_timed_out"):
                        acc[k] += m[k]
                    t["copier_ms"].setdefault(tname, []).extend(
                        r.device_s * 1e3 for r in subs[self.warmup:])
                    t["done"] = subs[0] if subs else t.get("done")
                if rnd == 0:
                    t["check"] = self._check(pools, batch, src, dst, guards)
                self._poison_slots(pools, dst_level, d_dst)
        self.host_probe(batch["id"], "after")
        self.samples = self.base_samples
        mech = {"ce-page": "cudaMemcpyAsync per page and pool (copy engine)",
                "ce-batch": "one cudaMemcpyBatchAsync for every page and pool, srcAccessOrder="
                            "Stream (copy engine)",
                "kernel": "SM copy kernel (LDGSTS) reading/writing mapped host memory, one "
                          "launch per pool"}
        for t in todo:
            path, ctas, real, done = t["path"], t["ctas"], t["real"], t.get("done")
            ok, detail = t["check"] if t["check"] is not None else (None, "not checked")
            for tname in [x for x in ("issue", "gated") if x in t["meas"]]:
                rec = {"name": f"{sk}_to_{dk}_plan_{path}", "section": "plan_batches",
                       "src": sk, "dst": dk, "path": path, "ctas": ctas,
                       "executed_path": done.path if done else real,
                       "executed_ctas": done.ctas if done else None,
                       "calls": done.calls if done else None,
                       "inflight_bytes": (int(self.hw.kernel.default_inflight_bytes[batch["direction"]])
                                          if (done.path if done else real) == "kernel" else None),
                       "mechanism": ("PlanCopier with the CopySelector choosing: " + mech[real]
                                     if path == SELECT else mech[path]),
                       "timing": f"cuda_events_{tname}", "params": params,
                       "selector_pick": {"path": pick[0], "ctas": pick[1]},
                       "rounds": t["rounds"], "copier_device_ms": t["copier_ms"].get(tname, [])}
                if path == SELECT and done is not None:
                    rec["copier_predicted_device_s"] = done.predicted_device_s
                    rec["copier_predicted_host_s"] = done.predicted_host_s
                self.samples = len(t["meas"][tname].get("aggregate_ms", [])) or t["samples"]
                self.add(rec, t["meas"][tname], [nbytes], ok, detail)
                self.samples = self.base_samples

    def add(self, rec: dict, meas: dict, bytes_per_stream: list[int], verified: bool | None,
            detail: str, labels: list[str] | None = None) -> dict:
        """:meth:`Bench.add`, then (unless ``--full-records``) the record made compact: times
        rounded to 0.1 us (CUDA events resolve about 0.5 us), ``samples_gbs`` (bytes over each
        sample), ``host_total_ms`` and ``copier_device_ms`` (the copier's own events, equal to
        the samples within a microsecond) dropped, and the host enqueue times kept on the
        ``cuda_events_issue`` records only (the judge reads them there)."""
        out = super().add(rec, meas, bytes_per_stream, verified, detail, labels)
        if self.full_records:
            return out
        for k in ("samples_gbs", "host_total_ms", "copier_device_ms"):
            out.pop(k, None)
        if out.get("timing") != "cuda_events_issue":
            out.pop("host_enqueue_ms", None)
        for k in ("samples_ms", "host_enqueue_ms"):
            if isinstance(out.get(k), list):
                out[k] = [round(float(x), 4) for x in out[k]]
        for k in ("median_ms", "median_gbs"):
            if isinstance(out.get(k), float):
                out[k] = round(out[k], 4)
        return out

    # -- summary ---------------------------------------------------------------------------------
    def summary(self) -> dict:
        by_batch: dict[str, dict] = {}
        for r in self.records:
            if r.get("status") != "ok" or r["timing"] != "cuda_events_issue":
                continue
            b = by_batch.setdefault(r["params"]["batch_id"], {"points": {}, "pick": r["selector_pick"]})
            key = r["path"] if r["ctas"] is None else f"{r['path']}:{r['ctas']}"
            b["points"][key] = r["median_ms"]
        out = {}
        for bid, b in by_batch.items():
            fixed = {k: v for k, v in b["points"].items() if not k.startswith(SELECT)}
            if not fixed:
                continue
            best = min(fixed, key=fixed.get)
            pk = b["pick"]["path"] if b["pick"]["ctas"] is None else \
                f"{b['pick']['path']}:{b['pick']['ctas']}"
            out[bid] = {"best": best, "best_ms": fixed[best], "pick": pk,
                        "pick_ms": fixed.get(pk), "select_ms": b["points"].get(SELECT)}
        return {"issue_median_ms_by_batch": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hw.bench_plan_batches",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", help="directory for <date>-plan-batches.json (not needed with --dry-run)")
    ap.add_argument("--quick", action="store_true", help="smoke test: a few batches, 3 CTA counts")
    ap.add_argument("--select-only", action="store_true",
                    help="per batch only the selector's pick (as a fixed point) and select")
    ap.add_argument("--dry-run", action="store_true",
                    help="list batches, paths, bytes and the estimated run time; no GPU needed")
    ap.add_argument("--batches", help="batch list JSON (kvsim.calibration.plan_batches list --json); "
                                      "default: generate it now")
    ap.add_argument("--hardware", default="h200-sxm", help="preset the selector prices with")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, default=20260123, help="guard-slot sampling")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up samples (default 1)")
    ap.add_argument("--samples", type=int, default=None, help="timed samples (default 5, quick 3)")
    ap.add_argument("--small-samples", type=int, default=21,
                    help="timed samples of points the model prices under 1 ms, in 3 passes over "
                         "the batch's points (default 21; 0: --samples in one pass)")
    ap.add_argument("--mid-samples", type=int, default=7,
                    help="the same for points under 10 ms (default 7; 0: --samples in one pass)")
    ap.add_argument("--no-host-probe", dest="host_probe", action="store_false",
                    help="leave out the host probe before each pass (module doc)")
    ap.add_argument("--full-records", action="store_true",
                    help="keep every per-sample list at full precision (default: compact records, "
                         "see PlanBench.add)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting new points after this many seconds (default 60 quick, "
                         "390 full); what was measured is written")
    args = ap.parse_args(argv)
    args.warmup = 1 if args.warmup is None else args.warmup
    args.samples = (3 if args.quick else 5) if args.samples is None else args.samples
    if args.budget_s is None:
        args.budget_s = 60.0 if args.quick else 390.0
    if not args.dry_run and not args.out:
        ap.error("--out is required (except with --dry-run)")

    from kvsim.hardware import load_hardware

    hw = load_hardware(args.hardware)
    t0 = time.perf_counter()
    blist = load_list(args.batches, args.quick)
    batches = [b for b in blist["batches"] if b.get("quick") or not args.quick]
    rows, est = plan_table(hw, batches, args.quick, args.warmup, args.samples, args.select_only,
                           args.small_samples or None, args.mid_samples or None, args.host_probe)
    if args.dry_run:
        print_plan(rows, est, len(groups(batches)))
        print(f"split: {blist['split']['rule']}")
        print(f"(batch list {time.perf_counter() - t0:.1f} s; warm-up {args.warmup}, samples "
              f"{args.samples}, budget {args.budget_s:.0f} s)")
        return 0

    os.makedirs(args.out, exist_ok=True)
    prov = provenance(args.device)
    path = os.path.join(args.out, f"{prov['date_utc'][:10]}-plan-batches.json")
    print(f"GPU {prov['gpu_name']} driver {prov['nvml_start'].get('driver_version')} "
          f"CUDA runtime {prov['cuda_runtime_version']} -> {path}; {len(batches)} batches, "
          f"estimated {est:.0f} s", flush=True)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": "python3 -m hw.bench_plan_batches " + " ".join(argv if argv is not None
                                                                 else sys.argv[1:]),
        "mode": ("quick" if args.quick else "full") + (" select-only" if args.select_only else ""),
        "hardware_preset": args.hardware,
        "units": {"bandwidth": "GB/s = 1e9 bytes/s (payload bytes, one direction)",
                  "time": "ms (CUDA event elapsed time)"},
        "provenance": prov,
        "method": (__doc__ or "").split("Every measurement", 1)[-1].strip(),
        "config": {"warmup": args.warmup, "samples": args.samples,
                   "small_samples": args.small_samples, "mid_samples": args.mid_samples,
                   "small_point_s": SMALL_POINT_S, "mid_point_s": MID_POINT_S, "rounds": ROUNDS,
                   "compact_records": not args.full_records, "budget_s": args.budget_s,
                   "seed": args.seed, "poison_byte": POISON, "base_ctas": list(BASE_CTAS),
                   "quick_ctas": list(QUICK_CTAS), "gated_perpage_max_copies": GATED_PERPAGE_MAX,
                   "gated_batch_max_copies": GATED_BATCH_MAX, "guard_sample": GUARD_SAMPLE,
                   "estimated_s": est,
                   "host_probe": ({"pages": PROBE_PAGES, "pool_slot_bytes": list(PROBE_LAYOUT),
                                   "pool_slots": PROBE_SLOTS, "direction": "offload",
                                   "slots": "0..63 both sides", "reps": PROBE_REPS,
                                   "points": [p if c is None else f"{p}:{c}" for p, c in PROBE_POINTS],
                                   "statistic": "median host enqueue ms per path"}
                                  if args.host_probe else None)},
        "split": blist["split"],
        "targets": blist.get("targets"),
        "batch_list": {k: v for k, v in blist.items() if k != "batches"},
        "batches": batches,
    }
    bench = None
    rc = 0

    def dump() -> None:
        doc["elapsed_s"] = round(time.perf_counter() - t0, 1)  # also before the bench exists
        if bench is not None:
            doc["host_probes"] = bench.host_probes
        write_doc(doc, bench, path, t0)

    last_dump = [time.perf_counter()]

    def progress() -> None:
        if time.perf_counter() - last_dump[0] > 15.0:
            dump()
            last_dump[0] = time.perf_counter()

    try:
        bench = PlanBench(args, hw)
        bench.on_batch = progress
        for key, grp in groups(batches):
            if bench.time_left() < 0:
                for b in grp:
                    bench.skip(f"{b['id']} (all points)")
                continue
            print(f"[pool set {key[0]} B x {key[1]} device / {key[2]} host slots: "
                  f"{len(grp)} batches]", flush=True)
            try:
                bench.run_group(key, grp)
            except Exception as exc:
                bench.section_failed(f"pool set {key}", exc)
            print(f"-- pool set done at {time.perf_counter() - t0:.1f} s", flush=True)
            dump()
        doc["nvml_end"] = nvml_snapshot(args.device, brief=True)
        doc["summary"] = bench.summary()
        dump()
        if bench.failed_checks or bench.section_errors:
            rc = 1
        print(f"\n{len(bench.records)} records, {bench.failed_checks} failed checks, "
              f"{bench.section_errors} errors, {len(bench.skipped)} points skipped for time; "
              f"{time.perf_counter() - t0:.1f} s; wrote {path}", flush=True)
        for p in bench.problems:
            print(f"problem: {p}", flush=True)
        print(f"judge: python -m kvsim.calibration.plan_batches judge {path} --hardware "
              f"{args.hardware}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        doc["fatal"] = f"{type(exc).__name__}: {exc}"
        rc = 2
    finally:
        dump()
        if bench is not None:
            bench.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
