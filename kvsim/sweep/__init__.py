"""Capacity-planning sweeps: many ordinary scenario runs over a grid of parameters, one table.

``kvsim sweep SCENARIO --param KEY=V1,V2 ...`` expands the points (a grid, or N sampled with
``--method random|lhs``), runs each as an ordinary scenario run with its overrides and a
per-point seed (:mod:`kvsim.sweep.points`), on a local process pool or on Dask distributed
(:mod:`kvsim.sweep.backends`), and writes one tidy table, one row per point
(:mod:`kvsim.sweep.table`), plus a capacity-planning report (:mod:`kvsim.sweep.report`).

A scenario file may carry a ``sweep:`` block (:mod:`kvsim.sweep.spec`) that the command reads
when no ``--param`` is given; ``scenarios/sweeps/example.yaml`` is one.

pandas and pyarrow (and Dask for ``--backend dask``) come with ``pip install 'kvsim[sweep]'``;
this package imports them only where they are used.
"""

from kvsim.sweep.points import Point, expand_values, point_id, point_seed, run_point
from kvsim.sweep.spec import Part, Sweep, load_sweep, load_sweep_scenario

__all__ = ["Part", "Point", "Sweep", "expand_values", "load_sweep", "load_sweep_scenario",
           "point_id", "point_seed", "run_point"]
