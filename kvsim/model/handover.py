"""A measured GIL hand-over, as data: how long a holder keeps the GIL while others wait.

What the numbers mean and how the simulator draws from them is in :mod:`kvsim.sim.gil`; how
they are measured and fitted, in :mod:`kvsim.calibration.gil_handover` and
:mod:`kvsim.calibration.gil_fit`. CPU presets carry them (:mod:`kvsim.model.cpu_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Handover:
    """A measured GIL hand-over (see the module docstring).

    ``hold``: (probabilities rising from 0 to 1, seconds not falling): quantiles of how long a
    holder running Python keeps the GIL while one worker waits, counted from when it got the GIL
    (or the first worker began to wait). ``starter_takeover_per_s``: the rate at which the thread
    starting the others takes the GIL over (exponential waits) while one worker waits."""

    hold: tuple[tuple[float, ...], tuple[float, ...]]
    waiter_exponent: float = 0.0
    recent_taker_share: float = 0.0
    starter_takeover_per_s: float = 0.0
