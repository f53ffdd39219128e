"""A CUDA stream of copy batches: FIFO on the device, each batch through its copy path.

``submit`` returns at once with an event that fires when the batch's last byte has landed
(stream semantics: the API that submitted it may already have returned). Batches on one stream
run one after another; batches on different streams share the link.

With a disk (:class:`~kvsim.hardware.disk.DiskSpec`), a batch to or from the disk level (level
2) waits the drive's latency, then moves its bytes on the disk's link; between the disk and the
GPU also on the CPU-GPU link at the same time (a pipelined bounce, or GPUDirect Storage), so at
the slower of the two. Batches between host and disk run in a queue of their own (disk I/O,
which no GPU work waits for: :meth:`CopyStream.off_stream`); a batch between disk and GPU stays
on the stream and starts only after the disk writes submitted before it (it may read them).
Without a disk, every batch between levels is a CPU-GPU copy on the stream.

A batch submitted by this project's copier (the ``select`` path) that starts after the stream has
been idle for at least the hardware's ``copier.idle_after_ms`` waits ``copier.idle_wake_us``
first (measured: the first copy after an idle spell runs that much longer).
"""

from __future__ import annotations

import math

import simpy

from kvsim.hardware.disk import MIXED_FACTOR, DiskSpec
from kvsim.hardware.spec import HardwareSpec
from kvsim.manager.plan import COPY_INTRA, CopyBatch
from kvsim.model.copy_paths import CopyRequest, device_work, host_seconds, lead_seconds
from kvsim.runtime.records import CopyRecord
from kvsim.sim.link import GB, Link

DISK_LEVEL = 2  # levels run GPU, host, disk (kvsim.manager.config)


class CopyStream:
    # Book a batch's requests before its last at once (see _drain): the same instants and
    # statistics as running them one by one (tests turn it off to compare).
    book_alone = True

    def __init__(self, env: simpy.Environment, name: str, link: Link, hw: HardwareSpec,
                 path_for: dict[str, str], ctas: int | None, inflight_bytes: int | None,
                 aligned: bool, disk: DiskSpec | None = None) -> None:
        self.env = env
        self.name = name
        self.link = link
        self.hw = hw
        self.path_for = path_for  # direction -> copy path
        self.ctas = ctas
        self.inflight_bytes = inflight_bytes
        self.aligned = aligned
        self.records: list[CopyRecord] = []
        self._selector = None
        self._requests: dict[tuple, list[CopyRequest]] = {}  # batch shape -> its requests
        self._works: dict[CopyRequest, object] = {}  # request -> its device work
        self.disk = disk
        self.disk_link = None if disk is None else Link(env, disk.per_direction_gbps, MIXED_FACTOR)
        self._disk_queue: simpy.Store = simpy.Store(env)
        self._last_disk_io: simpy.Event | None = None
        if disk is not None:
            env.process(self._drain(self._disk_queue))
        self._queue: simpy.Store = simpy.Store(env)
        self._last_end = -math.inf  # when the last batch finished: idle since the start
        env.process(self._drain())

    def requests_for(self, batch: CopyBatch) -> list[CopyRequest]:
        """How the batch is copied: one request for the whole page (KVCM2's paths), or -- with
        ``select``, the hardware executor's selector and copier -- one request per pool of the
        group, run one after another, the copier's per-batch costs on the first. A function of
        the batch's shape (direction, pool slot sizes, pages), so it is computed once per shape."""
        key = (batch.kind, batch.pool_slot_bytes, batch.num_pages)
        reqs = self._requests.get(key)
        if reqs is None:
            reqs = self._requests[key] = self._requests_of(batch)
        return reqs

    def _work(self, req: CopyRequest):
        """:func:`device_work` of ``req``, once per distinct request (a pure function of it)."""
        work = self._works.get(req)
        if work is None:
            work = self._works[req] = device_work(self.hw, req)
        return work

    def _requests_of(self, batch: CopyBatch) -> list[CopyRequest]:
        path, ctas = self.path_for[batch.kind], self.ctas
        if path != "select":
            return [CopyRequest(path, batch.kind, batch.page_bytes, batch.num_pages, ctas,
                                self.inflight_bytes, aligned=self.aligned)]
        from kvsim.model.copy_select import CopySelector

        if self._selector is None:
            self._selector = CopySelector(self.hw)
        sel = self._selector.choose(batch.kind, batch.pool_slot_bytes, batch.num_pages,
                                    self.aligned)
        inflight = self.inflight_bytes
        if sel.path == "kernel" and inflight is None:  # what the copier passes
            inflight = int(self.hw.kernel.default_inflight_bytes[batch.kind])
        return [CopyRequest(sel.path, batch.kind, int(sb), batch.num_pages, sel.estimate.ctas,
                            inflight, aligned=self.aligned, via_copier=i == 0)
                for i, sb in enumerate(batch.pool_slot_bytes)]

    def _on_disk(self, batch: CopyBatch) -> bool:
        return self.disk is not None and DISK_LEVEL in (batch.src_level, batch.dst_level)

    def off_stream(self, batch: CopyBatch) -> bool:
        """Does ``batch`` run in the disk I/O queue (host and disk only), not on the stream?"""
        return self._on_disk(batch) and 0 not in (batch.src_level, batch.dst_level)

    def submission_seconds(self, batch: CopyBatch) -> tuple[float, float]:
        """``(host time to submit batch, host time after which the device can start on it)``:
        the sum of its requests' :func:`kvsim.model.copy_paths.host_seconds`, and the
        ``lead_seconds`` of its first request (0 and 0 for intra-level copies, outside the link
        model)."""
        if batch.kind == COPY_INTRA or self._on_disk(batch):
            return 0.0, 0.0  # disk I/O submission is not modelled
        reqs = self.requests_for(batch)
        hosts = [host_seconds(self.hw, r) for r in reqs]
        return sum(hosts), lead_seconds(self.hw, reqs[0], hosts[0])

    def submit(self, batch: CopyBatch, thread: str, api: str,
               not_before: float | None = None) -> simpy.Event:
        """Queue ``batch``; the device starts it no earlier than ``not_before`` (simulated time:
        when the host's submission lets it start)."""
        done = self.env.event()
        if batch.kind == COPY_INTRA or self._on_disk(batch):
            path = "device-local" if batch.kind == COPY_INTRA else "disk"
            record = CopyRecord(self.name, thread, api, batch.kind, path, batch.num_pages,
                                batch.page_bytes, batch.num_bytes, None, 0, self.env.now)
        else:
            req = self.requests_for(batch)[0]
            work = self._work(req)
            record = CopyRecord(self.name, thread, api, batch.kind, req.path, batch.num_pages,
                                batch.page_bytes, batch.num_bytes, work.ctas, work.sms,
                                self.env.now)
        self.records.append(record)
        if self.off_stream(batch):
            self._disk_queue.put((batch, record, done, not_before, None))
            self._last_disk_io = done
        else:
            after = self._last_disk_io if self._on_disk(batch) else None
            self._queue.put((batch, record, done, not_before, after))
        return done

    def _drain(self, queue: simpy.Store | None = None):
        queue = self._queue if queue is None else queue
        while True:
            batch, record, done, not_before, after = yield queue.get()
            if not_before is not None and not_before > self.env.now:
                yield self.env.timeout(not_before - self.env.now)
            if after is not None and not after.processed:
                yield after
            record.started = self.env.now
            if batch.kind == COPY_INTRA:
                yield self.env.timeout(batch.num_bytes / (self.hw.device_copy_gbps * GB))
            elif self._on_disk(batch):
                yield from self._disk_copy(batch, record)
            else:
                idle = self.env.now - self._last_end
                reqs = self.requests_for(batch)
                if self.book_alone and len(reqs) > 1:
                    # This queue is its link's only user (the executor gives the stream a link of
                    # its own; the disk queue moves bytes on the disk's link only), so the
                    # requests before the batch's last run alone: booked at once, then one wait.
                    yield from self._wait(self._book_alone(batch, reqs[:-1], idle))
                    reqs = reqs[-1:]
                for req in reqs:
                    work = self._work(req)
                    for wait in self._waits_before(req, work, idle):
                        yield self.env.timeout(wait)
                    yield self.link.transfer(work.num_bytes, batch.kind, work.cap_gbps,
                                             tag=f"{record.thread}:{record.api}",
                                             cap_both_gbps=work.cap_both_gbps)
            record.finished = self.env.now
            if queue is self._queue:  # the stream's idle time (the disk queue is not the stream)
                self._last_end = self.env.now
            done.succeed()

    def _book_alone(self, batch: CopyBatch, reqs: list[CopyRequest], idle: float) -> list[float]:
        """Book ``reqs`` back to back on the idle link from now (:meth:`Link.alone`), as the loop
        in :meth:`_drain` would run them; returns the waits that loop would make, in order."""
        waits: list[float] = []
        t = self.env.now
        for req in reqs:
            work = self._work(req)
            for wait in self._waits_before(req, work, idle):
                waits.append(wait)
                t = t + wait
            waits.append(self.link.alone(work.num_bytes, batch.kind, work.cap_gbps,
                                         work.cap_both_gbps, at=t))
            t = t + waits[-1]
        return waits

    def _waits_before(self, req: CopyRequest, work, idle: float) -> list[float]:
        """What a request waits before its bytes move: the copier's wake-up after an idle
        spell of the stream (``idle`` seconds), then its path's fixed time; zero ones left out."""
        waits = []
        if req.via_copier and idle * 1e3 >= self.hw.copier.idle_after_ms:
            waits.append(self.hw.copier.idle_wake_us[req.direction] * 1e-6)
        if work.fixed_seconds:
            waits.append(work.fixed_seconds)
        return waits

    def _wait(self, waits: list[float]):
        """Wait as a chain of timeouts of ``waits`` would (each ends at the float ``now +
        wait``): in one timeout when that lands on the same instant, which it does whenever the
        chain is short beside the clock (Sterbenz: ``end - now`` is then exact), else the chain."""
        now = end = self.env.now
        for w in waits:
            end = end + w
        if now + (end - now) == end:
            if end > now:
                yield self.env.timeout(end - now)
            return
        for w in waits:
            if w:
                yield self.env.timeout(w)

    def _disk_copy(self, batch: CopyBatch, record: CopyRecord):
        """The drive's latency, then the bytes on the disk (and on the CPU-GPU link at once when
        the other end is the GPU, at most at the disk's rate)."""
        kind, disk = batch.kind, self.disk
        yield self.env.timeout(disk.latency_s(kind))
        tag = f"{record.thread}:{record.api}"
        rate = disk.per_direction_gbps[kind]
        moves = [self.disk_link.transfer(batch.num_bytes, kind, rate, tag=tag)]
        if 0 in (batch.src_level, batch.dst_level):
            moves.append(self.link.transfer(batch.num_bytes, kind, rate, tag=tag))
        yield self.env.all_of(moves)
