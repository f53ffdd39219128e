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

from importlib import import_module

_WHERE = {"Point": "points", "expand_values": "points", "point_id": "points",
          "point_seed": "points", "run_point": "points",
          "Part": "spec", "Sweep": "spec", "load_sweep": "spec", "load_sweep_scenario": "spec"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    # Imported on first use (PEP 562): `kvsim sweep --help` loads this package, not the engine.
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"kvsim.sweep.{_WHERE[name]}"), name)
