"""Timed Mooncake replay: each request of a Mooncake trace arrives, prefills, decodes and leaves.

One request's calls (phases in brackets), after waiting ``Until(timestamp_ms / 1000 *
time_scale)``:

1. [arrival] ``probe_reuse(prompt)`` -- what the router would ask (``probe_on_arrival``);
2. [prefill] ``create_kv_cache(prompt)`` (adopts the reusable prefix), ``resume()``,
   ``resize(capacity = input, history_length = input)``, optionally a prefill delay of
   ``prefill_token_interval_us`` per new token, ``commit`` of the prompt tokens beyond the
   matched prefix, ``resize(capacity = input + output)`` (the output's room: KVCM2 counts these
   blocks as generation allocations, the prompt's as misses), then ``commit_pending_stats()``;
3. [decode] ``output_length`` generated tokens in steps of ``decode_step_tokens``: each step
   sleeps ``decode_token_interval_us`` per token, then (if ``decode_resize``) ``resize(capacity,
   history_length = tokens so far)`` and ``commit`` of the step's tokens. A larger step commits
   decode tokens every few blocks instead of every block (fewer calls, a faster replay): on the
   synthetic trace at 32 tokens per block, 128 instead of 32 gives 54,341 calls instead of
   81,511 and 16.6 instead of 19.5 s of CPU, with the hit rate unchanged (0.61888), since no
   other request's prompt holds a request's generated tokens
   (``python -m kvsim.bench.replay --timed-only --decode-step-tokens N --json``, 2026-12-04);
4. [finish] ``commit_pending_stats()``, ``suspend()``, ``close()``. (KVCM2's own engine
   publishes each scheduled request's statistics every iteration; twice per request is enough
   for the totals, and a request that fails later loses only its decode figures.)

A ``resume`` or ``resize`` that returns False (out of pages, GPU too full to resume) or raises is
recorded by the executor as a failed call; the request then closes its cache and ends (counted
in :class:`MooncakeReplayStats`). Prompts come from :func:`kvsim.traces.mooncake.tokens_for`
(equal hash ids give equal blocks), generated tokens from each request's own stream.

Threads: ``client_threads`` None gives every request its own thread (``req00000`` ...), so
requests overlap exactly as their timestamps say. An integer N gives N client threads
(``client000`` ...) that take requests in trace order as they become free (a request waits for a
free client when all are busy).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kvsim.manager import KvCache, KVCacheManager, ManagerConfig, Outcome
from kvsim.manager.limits import MAX_SEQUENCE_TOKENS
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, Sleep, Step, Until, Workload
from kvsim.traces.mooncake import MooncakeRequest, MooncakeTrace, load_mooncake, output_tokens_for, tokens_for
from kvsim.validation import MAX_THREADS, Bool, FloatRange, IntRange, Str, schema


@schema
@dataclass(frozen=True)
class MooncakeReplayWorkload:
    trace: Str  # path of the Mooncake JSONL trace
    max_requests: IntRange(1) | None = None  # replay only the first N requests
    time_scale: FloatRange(0.0, 1e9) = 1.0  # arrival times are multiplied by this (0.5: 2x rate)
    decode_step_tokens: IntRange(1, MAX_SEQUENCE_TOKENS) = 32  # tokens per decode resize+commit
    decode_token_interval_us: FloatRange(0.0, 1e12) = 20_000.0  # time per generated token
    prefill_token_interval_us: FloatRange(0.0, 1e12) = 0.0  # per prompt token not reused
    decode_resize: Bool = True  # a resize (history advance) before each decode commit
    probe_on_arrival: Bool = True  # False: skip step 1 (create_kv_cache matches anyway)
    client_threads: IntRange(1, MAX_THREADS) | None = None  # None: one thread per request
    skip_bad_lines: Bool = False
    kind: Literal["mooncake"] = "mooncake"


@dataclass
class MooncakeReplayStats:
    """What the replay saw, filled in while it runs (read it after the executor finished)."""

    requests: int = 0  # requests that arrived
    completed: int = 0  # requests that reached close() after their last decode commit
    create_failed: int = 0
    resume_failed: int = 0
    resize_failed: int = 0
    input_tokens: int = 0
    probed_tokens: int = 0  # reusable tokens probe_reuse reported on arrival
    reused_tokens: int = 0  # tokens create_kv_cache adopted (its matched prefix)
    output_tokens: int = 0  # generated tokens committed
    failed_requests: list[int] = field(default_factory=list)  # request indices, in order
    # Threads of a real (hardware) executor update these concurrently.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def fail(self, kind: str, request: int) -> None:
        with self._lock:
            setattr(self, kind, getattr(self, kind) + 1)
            self.failed_requests.append(request)

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.input_tokens if self.input_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "requests": self.requests, "completed": self.completed,
            "create_failed": self.create_failed, "resume_failed": self.resume_failed,
            "resize_failed": self.resize_failed, "input_tokens": self.input_tokens,
            "probed_tokens": self.probed_tokens, "reused_tokens": self.reused_tokens,
            "output_tokens": self.output_tokens, "hit_rate": self.hit_rate,
            "failed_requests": list(self.failed_requests),
        }


class _Replay:
    def __init__(self, manager: KVCacheManager, spec: MooncakeReplayWorkload,
                 requests: tuple[MooncakeRequest, ...], stats: MooncakeReplayStats) -> None:
        self.manager = manager
        self.spec = spec
        self.requests = requests
        self.stats = stats

    def request(self, req: MooncakeRequest) -> Iterator[Step]:
        spec, m, stats = self.spec, self.manager, self.stats
        yield Until(req.arrival_s * spec.time_scale)
        stats.add(requests=1, input_tokens=req.input_length)
        prompt = tokens_for(req)
        cid = f"r{req.index}"
        base = {"request": req.index, "cache_id": cid}
        out: dict = {}

        def probe() -> Outcome:
            outcome = m.probe_reuse.with_plan(prompt)
            if outcome.error is None:
                stats.add(probed_tokens=outcome.value)
            return outcome

        if spec.probe_on_arrival:
            yield Call("arrival", Api.PROBE_REUSE, base | {"tokens": req.input_length}, probe)

        def keep(key: str, call):
            """The call, keeping what it returned under ``key`` (the next steps depend on it)."""
            def run() -> Outcome:
                outcome = call()
                out[key] = outcome.value
                return outcome
            return run

        yield Call("prefill", Api.CREATE_KV_CACHE, base | {"tokens": req.input_length},
                   keep("cache", lambda: m.create_kv_cache.with_plan(prompt, cache_id=cid)))
        cache: KvCache | None = out.get("cache")
        if cache is None:
            stats.fail("create_failed", req.index)
            return
        matched = cache.num_committed_tokens
        stats.add(reused_tokens=matched)
        yield Call("prefill", Api.RESUME, base, keep("resume", cache.resume.with_plan))
        if out.get("resume") is not True:
            stats.fail("resume_failed", req.index)
            yield Call("prefill", Api.CLOSE, base, cache.close.with_plan)
            return
        capacity = req.input_length + req.output_length
        history = req.input_length
        yield Call("prefill", Api.RESIZE, base | {"capacity": history, "history_length": history},
                   keep("resize", lambda: cache.resize.with_plan(history, history)))
        if out.get("resize") is not True:
            stats.fail("resize_failed", req.index)
            yield Call("prefill", Api.CLOSE, base, cache.close.with_plan)
            return
        new = prompt[matched:]
        if spec.prefill_token_interval_us and new.size:
            yield Sleep(new.size * spec.prefill_token_interval_us * 1e-6)
        if new.size:
            yield Call("prefill", Api.COMMIT, base | {"tokens": int(new.size)},
                       lambda: cache.commit.with_plan(new))
        if capacity > history:
            yield Call("prefill", Api.RESIZE, base | {"capacity": capacity},
                       keep("resize", lambda: cache.resize.with_plan(capacity)))
            if out.get("resize") is not True:
                stats.fail("resize_failed", req.index)
                yield Call("prefill", Api.CLOSE, base, cache.close.with_plan)
                return
        yield Call("prefill", Api.COMMIT_PENDING_STATS, base, cache.commit_pending_stats.with_plan)
        generated = output_tokens_for(req) if req.output_length else None
        done = 0
        step = spec.decode_step_tokens
        while done < req.output_length:
            k = min(step, req.output_length - done)
            if spec.decode_token_interval_us:
                yield Sleep(k * spec.decode_token_interval_us * 1e-6)
            if spec.decode_resize:
                h = history + done + k
                yield Call("decode", Api.RESIZE, base | {"capacity": capacity, "history_length": h},
                           lambda h=h: cache.resize.with_plan(capacity, h))
            toks = generated[done:done + k]  # type: ignore[index]

            def commit(toks=toks, k=k) -> Outcome:
                outcome = cache.commit.with_plan(toks)
                if outcome.error is None:
                    stats.add(output_tokens=k)
                return outcome

            yield Call("decode", Api.COMMIT, base | {"tokens": k}, commit)
            done += k
        yield Call("finish", Api.COMMIT_PENDING_STATS, base, cache.commit_pending_stats.with_plan)
        yield Call("finish", Api.SUSPEND, base, cache.suspend.with_plan)
        yield Call("finish", Api.CLOSE, base, cache.close.with_plan)
        stats.add(completed=1)

    def per_request_threads(self) -> dict[str, Iterator[Step]]:
        width = max(5, len(str(len(self.requests) - 1)))
        return {f"req{r.index:0{width}d}": self.request(r) for r in self.requests}

    def client_threads(self, n: int) -> dict[str, Iterator[Step]]:
        # Shared by the clients: a free client takes the next request. (Advancing a tuple
        # iterator is atomic under the GIL, so real threads may share it too.)
        queue = iter(self.requests)

        def client() -> Iterator[Step]:
            for req in queue:
                yield from self.request(req)

        width = max(3, len(str(n - 1)))
        return {f"client{i:0{width}d}": client() for i in range(n)}


def load_requests(spec: MooncakeReplayWorkload,
                  trace: MooncakeTrace | None = None) -> tuple[MooncakeRequest, ...]:
    if trace is None:
        trace = load_mooncake(Path(spec.trace), spec.skip_bad_lines)
    reqs = trace.requests
    return reqs if spec.max_requests is None else reqs[: spec.max_requests]


def build(config: ManagerConfig, spec: MooncakeReplayWorkload, manager: KVCacheManager,
          seed: int = 0, trace: MooncakeTrace | None = None
          ) -> tuple[Workload, MooncakeReplayStats]:
    """The workload and the statistics object its threads fill in as they run.

    ``trace``, if given, is used instead of loading ``spec.trace``. ``config`` and ``seed`` are
    unused (the trace fixes every request); they keep the signature of the other generators.
    """
    stats = MooncakeReplayStats()
    replay = _Replay(manager, spec, load_requests(spec, trace), stats)

    def threads() -> dict[str, Iterator[Step]]:
        if spec.client_threads is None:
            return replay.per_request_threads()
        return replay.client_threads(spec.client_threads)

    return Workload(setup=(), make_threads=threads), stats


def workload(config: ManagerConfig, spec: MooncakeReplayWorkload, manager: KVCacheManager,
             seed: int = 0, trace: MooncakeTrace | None = None) -> Workload:
    return build(config, spec, manager, seed, trace)[0]


__all__ = ["MooncakeReplayStats", "MooncakeReplayWorkload", "build", "workload"]
