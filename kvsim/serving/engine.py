"""A serving engine above the manager: requests of a Mooncake trace, one GPU, time to first token.

One thread, ``engine``, runs the scheduler loop of a continuous-batching engine:

1. every request whose arrival (``timestamp x time_scale``) has passed joins the waiting queue;
2. **admission**, first come first served, while the pass has room (at most ``max_running``
   requests; prefill tokens within ``max_batch_tokens`` minus one per decoding request; the
   first request of a pass is admitted whatever its size, so a long prompt is never starved):
   ``probe_reuse`` (how many tokens are cached, anywhere), ``create_kv_cache`` (adopts the
   prefix), ``resume`` (locks the prefix on the GPU: blocks on the host or disk are onboarded,
   and the copies queue on the copy stream behind any offloads), ``resize`` to the prompt. A
   ``resume`` or ``resize`` that finds no GPU room closes the cache and leaves the request at the
   head of the queue until a request finishes (``admission_retries``); a request that cannot be
   admitted into an idle engine fails;
3. **the pass** (:class:`~kvsim.runtime.steps.GpuWork`): the admitted requests' prefills, one by
   one, plus one decode step of every running request
   (:class:`~kvsim.llm.engine_time.EngineTimes`); it starts when the pass's copies have landed,
   or (``overlap_onboarding``) overlaps them layer by layer. The manager's copies share one
   FIFO stream, so a pass also waits for the evictions (offloads, disk writes) queued before
   its onboarding. Its end is each admitted request's
   first token;
4. after the pass: each admitted request commits its prompt and resizes for its output
   (``capacity = input + output``, as :mod:`kvsim.workloads.mooncake`), publishes its statistics
   and starts decoding; every running request has one more token; each commits its tokens every
   ``decode_commit_tokens`` (``resize(capacity, history)`` then ``commit``), and a request with
   all its tokens commits the rest, publishes, ``suspend``\\ s and ``close``\\ s (its blocks stay
   cached for later requests);
5. with nothing waiting or running, the engine sleeps until the next arrival.

Arrival times count from the first replayed request (``first_request``, 0 by default), times
``time_scale``. ``layers`` runs fewer of the architecture's layers (its KV bytes and pass times
scale with them: the engine times are per layer), for a hardware run that must keep up with the
trace on one GPU.

The manager must hold the architecture's KV cache: bytes per block (all layers' slots) equal to
``kv_bytes_per_token x tokens_per_block``, sliding-window layers where the architecture has
them (:func:`check_layout`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvsim.errors import ConfigError
from kvsim.llm.architectures import ARCHITECTURES, Architecture, architecture
from kvsim.llm.engine_time import EngineTimes, load_engine_times
from kvsim.manager import KVCacheManager, ManagerConfig, Outcome
from kvsim.manager.limits import MAX_LAYERS, MAX_SEQUENCE_TOKENS
from kvsim.runtime.apis import Api
from kvsim.runtime.steps import Call, GpuWork, Now, Step, Until, Workload
from kvsim.serving.stats import RequestRecord, ServingStats
from kvsim.traces.mooncake import MooncakeRequest, MooncakeTrace, load_mooncake, output_tokens_for, tokens_for
from kvsim.validation import Bool, FloatRange, IntRange, OneOf, Str, schema

ENGINE_THREAD = "engine"


@schema
@dataclass(frozen=True)
class ServingWorkload:
    trace: Str  # path of the Mooncake JSONL trace
    architecture: OneOf(*ARCHITECTURES)  # kvsim.llm.architectures (KV bytes, layers, window)
    engine_times: Str = "h200-sxm"  # kvsim/llm/engines/<name>.json, or a JSON file's path
    layers: IntRange(1, MAX_LAYERS) | None = None  # fewer of the architecture's layers
    first_request: IntRange(0) = 0  # start the replay at this request (a slice of the trace)
    max_requests: IntRange(1) | None = None  # N requests only
    time_scale: FloatRange(0.0, 1e9) = 1.0  # arrival times are multiplied by this (2: half rate)
    max_batch_tokens: IntRange(1, MAX_SEQUENCE_TOKENS) = 8192  # tokens per pass (see admission)
    max_running: IntRange(1, 65536) = 256  # requests in the engine at once
    decode_commit_tokens: IntRange(1, MAX_SEQUENCE_TOKENS) | None = None  # None: a block
    overlap_onboarding: Bool = False  # prefill overlaps onboarding layer by layer
    skip_bad_lines: Bool = False
    kind: Literal["serving"] = "serving"


def check_layout(config: ManagerConfig, arch: Architecture) -> None:
    """The manager's layers must store ``arch``'s KV cache (a ConfigError names both)."""
    per_block = sum(sum(layer.slot_bytes) for layer in config.layers)
    want = arch.kv_bytes_per_token * config.tokens_per_block
    if per_block != want:
        raise ConfigError(
            f"workload.architecture {arch.name}: manager.layers hold {per_block} bytes per block, "
            f"the architecture needs {want} ({arch.kv_bytes_per_token} bytes per token x "
            f"{config.tokens_per_block} tokens per block); for example one layer with slot_bytes "
            f"[{want // 2}, {want // 2}] (K and V of every layer)")
    windows = {layer.window_tokens for layer in config.layers}
    if windows != {arch.sliding_window}:
        attends = (f"a window of {arch.sliding_window}" if arch.sliding_window else "every token")
        raise ConfigError(f"workload.architecture {arch.name}: its layers attend {attends}, "
                          f"manager.layers have window_tokens {sorted(windows, key=str)}")


class _Request:
    """A request in the engine: its record, its cache, how far it has got."""

    __slots__ = ("req", "rec", "prompt", "cache", "generated", "committed", "outputs")

    def __init__(self, req: MooncakeRequest, rec: RequestRecord) -> None:
        self.req, self.rec = req, rec
        self.prompt = tokens_for(req)
        self.cache = None
        self.generated = 0  # tokens produced (the prefill pass makes the first)
        self.committed = 0  # of them, committed to the manager
        self.outputs = None

    @property
    def context(self) -> int:
        return self.req.input_length + self.generated


class _Kept:
    """A call's invocation that tallies its copies and keeps its value (None on an error) and
    plan, for the engine to read after the step."""

    __slots__ = ("invoke", "stats", "value", "plan")

    def __init__(self, invoke, stats: ServingStats) -> None:
        self.invoke, self.stats, self.value, self.plan = invoke, stats, None, None

    def __call__(self) -> Outcome:
        outcome = self.invoke()
        self.stats.add_copies(outcome.plan)
        self.value = outcome.value if outcome.error is None else None
        self.plan = outcome.plan
        return outcome


class _Engine:
    def __init__(self, manager: KVCacheManager, spec: ServingWorkload, times: EngineTimes,
                 requests: tuple[MooncakeRequest, ...], stats: ServingStats,
                 tokens_per_block: int) -> None:
        self.m, self.spec, self.times, self.requests, self.stats = (manager, spec, times,
                                                                    requests, stats)
        self.commit_every = spec.decode_commit_tokens or tokens_per_block
        self.shapes_run: set[tuple[int, int]] = set()  # (new, cached) prefilled so far

    def _call(self, phase: str, api: Api, r: _Request, invoke, **args) -> Call:
        """The call; after it ran, ``call.invoke.value`` and ``.plan`` are what it returned."""
        return Call(phase, api, {"request": r.req.index} | args, _Kept(invoke, self.stats))

    def _admit(self, r: _Request) -> Iterator[Step]:
        """create, resume, resize to the prompt; sets ``r.cache`` or leaves it None."""
        m, req = self.m, r.req
        create = self._call("admit", Api.CREATE_KV_CACHE, r,
                            lambda: m.create_kv_cache.with_plan(r.prompt, cache_id=f"r{req.index}"),
                            tokens=req.input_length)
        yield create
        cache = create.invoke.value
        if cache is None:
            r.rec.failed = "create_kv_cache failed"
            return
        resume = self._call("admit", Api.RESUME, r, cache.resume.with_plan)
        yield resume
        ok = resume.invoke.value is True
        if ok:
            for b in resume.invoke.plan.copies:
                if b.dst_level == 0 and b.src_level > 0:
                    r.rec.onboarded_pages[b.src_level] += b.num_pages
            history = req.input_length
            resize = self._call("admit", Api.RESIZE, r,
                                lambda: cache.resize.with_plan(history, history),
                                capacity=history, history_length=history)
            yield resize
            ok = resize.invoke.value is True
        if not ok:
            r.rec.onboarded_pages = [0, 0, 0]
            yield self._call("admit", Api.CLOSE, r, cache.close.with_plan)
            return
        r.cache = cache
        r.rec.cached_tokens = cache.num_committed_tokens
        r.rec.new_tokens = req.input_length - r.rec.cached_tokens

    def _after_prefill(self, r: _Request) -> Iterator[Step]:
        cache, req, rec = r.cache, r.req, r.rec
        new = r.prompt[rec.cached_tokens:]
        if new.size:
            yield self._call("prefill", Api.COMMIT, r, lambda: cache.commit.with_plan(new),
                             tokens=int(new.size))
        capacity = req.input_length + req.output_length
        if capacity > req.input_length:
            yield self._call("prefill", Api.RESIZE, r, lambda: cache.resize.with_plan(capacity),
                             capacity=capacity)
        yield self._call("prefill", Api.COMMIT_PENDING_STATS, r, cache.commit_pending_stats.with_plan)
        if req.output_length:
            r.outputs = output_tokens_for(req)

    def _commit_generated(self, r: _Request) -> Iterator[Step]:
        """Commit the tokens generated since the last commit (a history advance first)."""
        k = r.generated - r.committed
        if k <= 0:
            return
        cache, req = r.cache, r.req
        capacity = req.input_length + req.output_length
        h = req.input_length + r.generated
        yield self._call("decode", Api.RESIZE, r, lambda: cache.resize.with_plan(capacity, h),
                         capacity=capacity, history_length=h)
        toks = r.outputs[r.committed:r.generated]
        yield self._call("decode", Api.COMMIT, r, lambda: cache.commit.with_plan(toks), tokens=k)
        r.committed = r.generated

    def _finish(self, r: _Request, now: float) -> Iterator[Step]:
        yield from self._commit_generated(r)
        cache = r.cache
        yield self._call("finish", Api.COMMIT_PENDING_STATS, r, cache.commit_pending_stats.with_plan)
        yield self._call("finish", Api.SUSPEND, r, cache.suspend.with_plan)
        yield self._call("finish", Api.CLOSE, r, cache.close.with_plan)
        r.cache = None
        r.rec.finished = now

    def run(self) -> Iterator[Step]:
        spec, stats, times, reqs = self.spec, self.stats, self.times, self.requests
        waiting: deque[_Request] = deque()
        running: list[_Request] = []
        nxt, blocked = 0, False
        while True:
            now = yield Now()
            while nxt < len(reqs) and reqs[nxt].arrival_s * spec.time_scale <= now:
                rec = RequestRecord(reqs[nxt].index, reqs[nxt].arrival_s * spec.time_scale,
                                    reqs[nxt].input_length, reqs[nxt].output_length)
                stats.requests.append(rec)
                waiting.append(_Request(reqs[nxt], rec))
                nxt += 1
            if not running and (not waiting or blocked):
                if blocked:  # nothing runs, nothing will free room: the head can never fit
                    r = waiting.popleft()
                    r.rec.failed = r.rec.failed or "no GPU room in an idle engine"
                    blocked = False
                    continue
                if nxt >= len(reqs):
                    return
                yield Until(reqs[nxt].arrival_s * spec.time_scale)
                continue
            admitted: list[_Request] = []
            budget = spec.max_batch_tokens - len(running)
            while waiting and not blocked and len(running) + len(admitted) < spec.max_running:
                r = waiting[0]
                if admitted:
                    probe = self._call("admit", Api.PROBE_REUSE, r,
                                       lambda r=r: self.m.probe_reuse.with_plan(r.prompt),
                                       tokens=r.req.input_length)
                    yield probe
                    if r.req.input_length - (probe.invoke.value or 0) > budget:
                        break
                yield from self._admit(r)
                if r.rec.failed:
                    waiting.popleft()
                    continue
                if r.cache is None:  # no GPU room now: retry when a request has finished
                    stats.admission_retries += 1
                    blocked = True
                    break
                waiting.popleft()
                r.rec.admitted = now
                budget -= r.rec.new_tokens
                admitted.append(r)
            if not admitted and not running:
                continue
            prefill = 0.0
            for r in admitted:
                shape = (r.rec.new_tokens, r.rec.cached_tokens)
                prefill += times.prefill_seconds(*shape, cold=shape not in self.shapes_run)
                self.shapes_run.add(shape)
            decode = times.decode_seconds([r.context for r in running])
            layers = times.architecture.layers if spec.overlap_onboarding else 0
            t = yield GpuWork(prefill + decode, layers,
                              tuple((r.rec.new_tokens, r.rec.cached_tokens) for r in admitted),
                              tuple(r.context for r in running))
            stats.passes += 1
            stats.gpu_busy_s += prefill + decode
            stats.prefill_s += prefill
            stats.decode_s += decode
            stats.copy_wait_s += (t.end - t.start) - (prefill + decode)
            for r in running:
                r.generated += 1
            for r in admitted:
                r.rec.copies_landed, r.rec.first_token = t.copies_landed, t.end
                r.generated = 1 if r.req.output_length else 0
                yield from self._after_prefill(r)
            still = []
            for r in running + admitted:
                if r.generated >= r.req.output_length:
                    yield from self._finish(r, t.end)
                    blocked = False
                else:
                    if r.generated - r.committed >= self.commit_every:
                        yield from self._commit_generated(r)
                    still.append(r)
            running = still


def load_requests(spec: ServingWorkload, trace: MooncakeTrace | None = None):
    """The replayed slice, arrival times counted from its first request."""
    if trace is None:
        trace = load_mooncake(Path(spec.trace), spec.skip_bad_lines)
    end = None if spec.max_requests is None else spec.first_request + spec.max_requests
    reqs = trace.requests[spec.first_request:end]
    if not reqs:
        raise ConfigError(f"workload.first_request {spec.first_request}: the trace has "
                          f"{len(trace.requests)} requests")
    t0 = reqs[0].timestamp_ms
    return tuple(dataclasses.replace(r, timestamp_ms=r.timestamp_ms - t0) for r in reqs) if t0 \
        else reqs


def serving_architecture(spec: ServingWorkload) -> Architecture:
    """The architecture the engine runs: ``spec.architecture``, with ``spec.layers`` if set."""
    arch = architecture(spec.architecture)
    return arch if spec.layers is None else dataclasses.replace(arch, layers=spec.layers)


def workload(config: ManagerConfig, spec: ServingWorkload, manager: KVCacheManager,
             seed: int = 0) -> Workload:
    """The engine's workload; its ``summary`` is what the engine measured
    (:meth:`ServingStats.summary`). ``seed`` is unused (the trace fixes every request)."""
    arch = serving_architecture(spec)
    check_layout(config, arch)
    times = load_engine_times(spec.engine_times, arch)
    stats = ServingStats()
    engine = _Engine(manager, spec, times, load_requests(spec), stats, config.tokens_per_block)
    return Workload(setup=(), make_threads=lambda: {ENGINE_THREAD: engine.run()},
                    summary=stats.summary)


__all__ = ["ENGINE_THREAD", "ServingWorkload", "check_layout", "workload"]
