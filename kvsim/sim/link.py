"""A link in simulated time: two directions, fluid fair sharing, and the cost of running both
at once (the arithmetic: :mod:`kvsim.model.link_share`). The CPU-GPU link
(:meth:`Link.of_hardware`), and a disk (reads onboard, writes offload).

Rates change only when a transfer starts or finishes; between those instants every transfer moves
bytes at a constant rate, so the model is exact for this fluid description and costs O(transfers)
per change.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from kvsim.hardware.spec import DIRECTIONS, HardwareSpec
from kvsim.model.link_share import link_rates
from kvsim.runtime.records import LinkSegment, LinkStats

GB = 1e9
_EPS_BYTES = 1e-3


@dataclass
class Transfer:
    tid: int
    direction: str
    remaining: float  # bytes
    cap: float  # bytes/s
    cap_both: float  # bytes/s while the other direction is busy too
    done: simpy.Event
    tag: str
    rate: float = 0.0
    started: float = 0.0


class Link:
    def __init__(self, env: simpy.Environment, per_direction_gbps: dict[str, float],
                 bidirectional_factor: float) -> None:
        self.env = env
        self.solo_bps = {d: per_direction_gbps[d] * GB for d in DIRECTIONS}
        self.bidirectional_factor = bidirectional_factor
        self.active: list[Transfer] = []
        self.stats = LinkStats()
        self._last = 0.0
        self._booked_until = -1.0  # the end of the last transfer booked by alone()
        self._generation = 0
        self._next_id = 0

    @classmethod
    def of_hardware(cls, env: simpy.Environment, hw: HardwareSpec) -> Link:
        """The hardware's CPU-GPU link."""
        return cls(env, hw.link.per_direction_gbps, hw.link.bidirectional_factor)

    def transfer(self, num_bytes: int, direction: str, cap_gbps: float, tag: str = "",
                 cap_both_gbps: float | None = None) -> simpy.Event:
        """Move ``num_bytes`` in ``direction`` at up to ``cap_gbps`` (``cap_both_gbps`` while the
        other direction is busy); the event fires when done."""
        done = self.env.event()
        if num_bytes <= 0:
            return done.succeed()
        if self.env.now < self._booked_until:
            raise RuntimeError(f"Link.transfer at {self.env.now}: the link is booked alone until "
                               f"{self._booked_until} (alone() needs its caller to be the only user)")
        self._advance()
        both = cap_gbps if cap_both_gbps is None else cap_both_gbps
        self.active.append(Transfer(self._next_id, direction, float(num_bytes), cap_gbps * GB,
                                    both * GB, done, tag, started=self.env.now))
        self._next_id += 1
        self.stats.bytes[direction] += num_bytes
        self.stats.transfers[direction] += 1
        self._reschedule()
        return done

    def alone(self, num_bytes: int, direction: str, cap_gbps: float,
              cap_both_gbps: float | None = None, at: float | None = None) -> float:
        """:meth:`transfer` for a caller that knows nothing else will use the link from ``at``
        (default: now; not earlier) until this transfer ends: the same bookkeeping (its bytes,
        its segment, the link's clock), done at once. Returns the transfer's seconds, the float
        :meth:`transfer`'s timer would wait, so a caller that waits them from ``at`` reaches
        the same instant as a :meth:`transfer` started there; its rate is the one
        :func:`link_rates` gives it alone (``cap_both_gbps`` then never applies). The link's
        clock moves to the transfer's end (:meth:`_advance` from ``now`` with nothing active
        adds nothing)."""
        if num_bytes <= 0:
            return 0.0
        now = self.env.now if at is None else at
        if self.active or now < self.env.now or now < self._booked_until:
            raise RuntimeError("Link.alone: the link is busy (a transfer, or booked alone until "
                               f"{self._booked_until}), or the start {now} is in the past")
        # _reschedule's rate for this transfer alone on the link (no timer: nothing to reschedule)
        both = cap_gbps if cap_both_gbps is None else cap_both_gbps
        (rate,) = link_rates(self.solo_bps, self.bidirectional_factor,
                             [(direction, cap_gbps * GB, both * GB)])
        seconds = max(float(num_bytes) / rate, 0.0)
        end = now + seconds  # the instant a timeout of ``seconds`` started at ``now`` fires
        self.stats.bytes[direction] += num_bytes
        self.stats.transfers[direction] += 1
        agg = dict.fromkeys(DIRECTIONS, 0.0)
        agg[direction] += rate
        self.stats.segments.append(LinkSegment(now, end, agg["offload"], agg["onboard"]))
        self._last = self._booked_until = end
        return seconds

    def _advance(self) -> None:
        """Account bytes moved since the last change at the rates then in force."""
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            agg = dict.fromkeys(DIRECTIONS, 0.0)
            for t in self.active:
                t.remaining -= t.rate * dt
                agg[t.direction] += t.rate
            if any(agg.values()):
                self.stats.segments.append(LinkSegment(self._last, now, agg["offload"], agg["onboard"]))
        self._last = now

    def _reschedule(self) -> None:
        finished = [t for t in self.active if t.remaining <= _EPS_BYTES]
        self.active = [t for t in self.active if t.remaining > _EPS_BYTES]
        for t in finished:
            t.done.succeed()
        rates = link_rates(self.solo_bps, self.bidirectional_factor,
                           [(t.direction, t.cap, t.cap_both) for t in self.active])
        for t, rate in zip(self.active, rates):
            t.rate = rate
        self._generation += 1
        if self.active:
            dt = min(t.remaining / t.rate for t in self.active)
            gen = self._generation
            timer = self.env.timeout(max(dt, 0.0))
            timer.callbacks.append(lambda _e: self._on_timer(gen))

    def _on_timer(self, generation: int) -> None:
        if generation != self._generation:
            return  # a later change rescheduled
        self._advance()
        # Floating-point residue: the transfer that set the timer is finished by construction.
        soonest = min(self.active, key=lambda t: t.remaining / t.rate if t.rate else float("inf"))
        soonest.remaining = min(soonest.remaining, 0.0)
        self._reschedule()
