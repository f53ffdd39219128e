"""How transfers share the CPU-GPU link: the arithmetic of :class:`kvsim.sim.link.Link`.

Each direction has a solo bandwidth. While both directions carry traffic, each gets
``bidirectional_factor`` of its solo bandwidth (PCIe and C2C lose throughput to the shared
protocol and memory traffic; the factor is measured). Inside a direction, concurrent transfers
share max-min fairly, each capped by its own limit (its copy path's rate, or its rate while both
directions run): the capped ones take their cap and the rest split what is left equally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DIRECTIONS = ("offload", "onboard")


def max_min_share(capacity: float, caps: list[float]) -> list[float]:
    """Max-min fair rates for transfers with individual caps sharing ``capacity``."""
    if len(caps) == 1:  # the usual case (one stream): the loop below gives exactly this
        return [min(caps[0], capacity)]
    rates = [0.0] * len(caps)
    order = sorted(range(len(caps)), key=lambda i: caps[i])
    left, n = capacity, len(caps)
    for k, i in enumerate(order):
        share = left / (n - k)
        rates[i] = min(caps[i], share)
        left -= rates[i]
    return rates


def link_rates(solo_bps: Mapping[str, float], bidirectional_factor: float,
               transfers: Sequence[tuple[str, float, float]]) -> list[float]:
    """The rate (bytes/s) of each transfer ``(direction, cap, cap while both directions are
    busy)`` active on the link at once, in the order given."""
    groups: dict[str, list[int]] = {d: [] for d in DIRECTIONS}
    for i, t in enumerate(transfers):
        group = groups.get(t[0])
        if group is not None:
            group.append(i)
    both = all(groups.values())
    rates = [0.0] * len(transfers)
    for d, group in groups.items():
        if not group:
            continue
        capacity = solo_bps[d] * (bidirectional_factor if both else 1.0)
        caps = [transfers[i][2] if both else transfers[i][1] for i in group]
        for i, rate in zip(group, max_min_share(capacity, caps)):
            rates[i] = rate
    return rates
