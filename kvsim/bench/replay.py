"""Benchmarks of the Mooncake replays (figures for notes, not tests).

* ``cache_only``: the cache-only replay (:mod:`kvsim.replay.cache_only`) of a whole trace at one
  capacity (default 3M tokens, 512 tokens per block), by the block LRU or, with ``--engine
  manager``, through the manager. Timed: ``time.perf_counter`` around ``replay_cache`` (building
  the cache, synthesising tokens, every request); loading the trace is timed apart. Reports wall
  seconds, requests/s, blocks/s (prompt blocks of ``tokens_per_block`` tokens) and the manager
  calls/s the requests stand for (5 a request, 1 for an oversized one, whichever engine). Target
  (issue 21): <= 3 s for 12,000 requests (``--tile 3``).
* ``timed``: the timed replay (:mod:`kvsim.workloads.mooncake`) through the SimPy executor, 32
  tokens per block (one full-attention layer, GPU and host tiers of :data:`TIMED_GPU_TOKENS` and
  :data:`TIMED_HOST_TOKENS`), h200-sxm and the kvcm2-cpp CPU model, invariant and lock-discipline
  checks off (each is a from-scratch scan of the manager per call). Timed: ``perf_counter``
  around ``SimExecutor.run``. Reports wall seconds, simulated seconds, calls and SimPy events per
  second. Target: < 30 s on a 2-core machine.

Run: ``python -m kvsim.bench.replay [TRACE] [--capacity-tokens N] [--timed] [--digest] [--json]``
The timed replay prints how far it is to standard error every 10,000 calls (``--quiet``: it
does not).
(``--digest``: the timed replay also reports ``calls_digest``, to compare two versions' answers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# the Mooncake synthetic trace shipped in the repository (data/mooncake/README.md)
DEFAULT_TRACE = str(Path(__file__).resolve().parents[2] / "data" / "mooncake" /
                    "mooncake_synthetic_trace.jsonl")
TIMED_TOKENS_PER_BLOCK = 32
TIMED_GPU_TOKENS = 3_000_000
TIMED_HOST_TOKENS = 10_000_000
TIMED_SLOT_BYTES = (8192, 8192)  # per 32-token block: K and V of one modelled layer


def _machine() -> dict:
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.machine()}


def peak_rss_mib() -> float:
    """The process's peak resident memory so far (getrusage; KiB on Linux): run one benchmark
    per process to read its own peak."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(trace_path: str, tile: int = 1, span_s: float | None = None):
    """The trace, or ``tile`` copies of it over ``span_s`` seconds (:func:`tiled`)."""
    from kvsim.traces.mooncake import load_mooncake, tiled

    trace = load_mooncake(trace_path)
    return trace if tile == 1 else tiled(trace, tile, span_s or 1.024 * tile * 1000)


def cache_only(trace_path: str, capacity_tokens: int = 3_000_000, tokens_per_block: int = 512,
               runs: int = 1, tile: int = 1, span_s: float | None = None,
               engine: str = "lru") -> dict:
    from kvsim.replay.cache_only import max_hit_rate, replay_cache

    t0 = time.perf_counter()
    trace = load(trace_path, tile, span_s)
    load_s = time.perf_counter() - t0
    walls, cpus = [], []
    result = None
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        result = replay_cache(trace, capacity_tokens, tokens_per_block, engine=engine)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    assert result is not None
    wall = statistics.median(walls)
    blocks = sum(-(-r.input_length // tokens_per_block) for r in trace.requests)
    calls = 5 * (result.requests - result.oversized_requests) + result.oversized_requests
    return {
        "benchmark": "replay_cache_only",
        "trace": trace.path,
        "timing": f"perf_counter around replay_cache, median of {runs}",
        "capacity_tokens": capacity_tokens,
        "tokens_per_block": tokens_per_block,
        "engine": engine,
        "requests": result.requests,
        "prompt_blocks": blocks,
        "manager_calls": calls,
        "hit_rate": result.hit_rate,
        "max_hit_rate": max_hit_rate(trace, tokens_per_block),
        "load_s": load_s,
        "wall_s": wall,
        "cpu_s": statistics.median(cpus),  # process CPU time: less sensitive to other load
        "samples_s": walls,
        "requests_per_s": result.requests / wall,
        "blocks_per_s": blocks / wall,
        "calls_per_s": calls / wall,
        "peak_rss_mib": peak_rss_mib(),
        "machine": _machine(),
    }


def timed_config(tokens_per_block: int = TIMED_TOKENS_PER_BLOCK, enable_stats: bool = True):
    from kvsim.manager import LayerConfig, LevelConfig, ManagerConfig

    page = sum(TIMED_SLOT_BYTES)
    return ManagerConfig(
        layers=(LayerConfig(slot_bytes=TIMED_SLOT_BYTES),),
        levels=(LevelConfig("gpu", TIMED_GPU_TOKENS // tokens_per_block * page),
                LevelConfig("host", TIMED_HOST_TOKENS // tokens_per_block * page)),
        tokens_per_block=tokens_per_block,
        enable_stats=enable_stats,
    )


def calls_digest(calls) -> str:
    """SHA-256 over every call record's identity, times, outcome, work counts and CPU seconds:
    equal digests mean a change left every call of the replay as it was (the issue-21 rule)."""
    h = hashlib.sha256()
    for c in calls:
        h.update(json.dumps([c.index, c.thread, c.api, c.start, c.lock_granted, c.end, c.ok,
                             c.counts, c.cpu_s, c.copies_done], sort_keys=True).encode())
    return h.hexdigest()


def timed(trace_path: str, max_requests: int | None = None, client_threads: int | None = None,
          decode_step_tokens: int = 32, check: bool = False, hardware: str = "h200-sxm",
          cpu_model: str = "kvcm2-cpp", enable_stats: bool = True,
          probe_on_arrival: bool = True, tile: int = 1, span_s: float | None = None,
          digest: bool = False, progress=None) -> dict:
    """The timed replay's figures; ``progress``, a ``callable(str)``, is told how far the run
    is every :data:`~kvsim.runtime.pipeline.PROGRESS_EVERY_CALLS` calls."""
    from kvsim.hardware import load_hardware
    from kvsim.manager import KVCacheManager
    from kvsim.model.cpu_cost import load_cpu_model
    from kvsim.sim.executor import SimExecutor, SimOptions
    from kvsim.workloads.mooncake import MooncakeReplayWorkload, build

    trace = load(trace_path, tile, span_s)
    config = timed_config(enable_stats=enable_stats)
    manager = KVCacheManager(config)
    spec = MooncakeReplayWorkload(trace=trace_path, max_requests=max_requests,
                                  client_threads=client_threads,
                                  decode_step_tokens=decode_step_tokens,
                                  probe_on_arrival=probe_on_arrival)
    workload, stats = build(config, spec, manager, trace=trace)
    executor = SimExecutor(manager, load_hardware(hardware), load_cpu_model(cpu_model),
                           SimOptions(check_invariants=check, check_lock_discipline=check))
    executor.progress = progress
    t0, c0 = time.perf_counter(), time.process_time()
    run = executor.run(workload.make_threads())
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    failed = sum(1 for c in run.calls if not c.ok)
    extra = {"calls_digest": calls_digest(run.calls)} if digest else {}
    return extra | {
        "benchmark": "replay_timed_sim",
        "trace": trace.path,
        "timing": "perf_counter around SimExecutor.run (threads, manager calls, SimPy)",
        "tokens_per_block": config.tokens_per_block,
        "gpu_tokens": TIMED_GPU_TOKENS, "host_tokens": TIMED_HOST_TOKENS,
        "hardware": hardware, "cpu_model": cpu_model,
        "checks": check,
        "enable_stats": enable_stats,
        "probe_on_arrival": probe_on_arrival,
        "client_threads": client_threads,
        "decode_step_tokens": decode_step_tokens,
        "requests": stats.requests,
        "replay": stats.to_dict() | {"failed_requests": len(stats.failed_requests)},
        "calls": len(run.calls),
        "failed_calls": failed,
        "stuck_threads": len(run.stuck),
        "sim_end_s": run.end_time,
        "events": run.events_processed,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_s": stats.requests / wall,
        "calls_per_s": len(run.calls) / wall,
        "events_per_s": run.events_processed / wall,
        "sim_s_per_cpu_s": run.end_time / cpu if cpu else None,
        "peak_rss_mib": peak_rss_mib(),
        "machine": _machine(),
    }


def _say(message: str) -> None:
    print(f"timed replay: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvsim.bench.replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    p.add_argument("--capacity-tokens", type=int, default=3_000_000)
    p.add_argument("--tokens-per-block", type=int, default=512)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--engine", choices=("lru", "manager"), default="lru",
                   help="cache-only replay: the block LRU (default) or the manager")
    p.add_argument("--timed", action="store_true", help="also the timed replay (sim executor)")
    p.add_argument("--timed-only", action="store_true")
    p.add_argument("--max-requests", type=int, help="timed replay: first N requests only")
    p.add_argument("--client-threads", type=int, help="timed replay: N client threads")
    p.add_argument("--decode-step-tokens", type=int, default=32)
    p.add_argument("--check", action="store_true", help="timed replay: invariant checks on")
    p.add_argument("--no-stats", action="store_true",
                   help="timed replay: manager statistics off (enable_stats=False)")
    p.add_argument("--no-probe", action="store_true",
                   help="timed replay: no probe_reuse on arrival")
    p.add_argument("--tile", type=int, default=1,
                   help="replay N back-to-back copies of the trace (new hash ids each)")
    p.add_argument("--span-s", type=float,
                   help="with --tile: seconds the copies span in all (3 copies over 3600: the "
                        "one-hour, 11,979-request trace)")
    p.add_argument("--digest", action="store_true",
                   help="timed replay: add calls_digest, a hash of every call record (computed "
                        "after the timing), to compare two versions' answers")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true",
                   help="timed replay: no progress lines on standard error")
    args = p.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"{args.trace}: no such trace", file=sys.stderr)
        return 2
    out = []
    if not args.timed_only:
        out.append(cache_only(args.trace, args.capacity_tokens, args.tokens_per_block, args.runs,
                              args.tile, args.span_s, args.engine))
    if args.timed or args.timed_only:
        out.append(timed(args.trace, args.max_requests, args.client_threads,
                         args.decode_step_tokens, args.check,
                         enable_stats=not args.no_stats, probe_on_arrival=not args.no_probe,
                         tile=args.tile, span_s=args.span_s, digest=args.digest,
                         progress=None if args.quiet else _say))
    for result in out:
        if args.json:
            print(json.dumps(result, sort_keys=True))
        else:
            print(result["benchmark"])
            for key, value in result.items():
                if key not in ("benchmark", "machine", "samples_s", "replay"):
                    print(f"  {key:>18}: {value}")
            if "replay" in result:
                print(f"  {'replay':>18}: {result['replay']}")
    return 0


if __name__ == "__main__":
    from kvsim.sim.collector import leave_to_exit

    code = main()
    leave_to_exit()  # exit without a last collection over the replay's objects
    sys.exit(code)
