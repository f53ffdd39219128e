"""The sweep table: one row per point, typed columns, Parquet and CSV, and the run journal.

Columns, in order: ``point_id``, ``scenario`` (the scenario's name), one column per parameter
(named by its dotted key), ``point_seed``, ``status`` (``ok`` | ``error``), ``error``, the
results (:data:`kvsim.sweep.points.METRIC_COLUMNS`), the configuration each point ran
(``cfg_*``, :data:`kvsim.sweep.points.CONFIG_COLUMNS`), ``scenario_file``, ``scenario_hash``,
``params`` (the point's parameters as canonical JSON) and ``wall_s`` (seconds the point took in
its worker: the one column that varies run to run). Missing values are nulls. Rows are sorted by
``point_id``, so the table does not depend on the backend, the worker count or completion order.

While a sweep runs, every finished row is appended to ``points.jsonl`` in the output directory;
a re-run reads it (and ``results.parquet``) to skip finished points, so an interrupted sweep
loses only the points in flight. The journal is removed once the table is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvsim.sweep.points import CONFIG_COLUMNS, METRIC_COLUMNS
from kvsim.sweep.spec import yaml_scalar

TABLE = "results.parquet"
CSV = "results.csv"
JOURNAL = "points.jsonl"
HEAD = ("point_id", "scenario")
MIDDLE = ("point_seed", "status", "error")
TAIL = ("scenario_file", "scenario_hash", "params", "wall_s")
KINDS: dict[str, str] = {
    "point_id": "str", "scenario": "str", "point_seed": "int", "status": "str", "error": "str",
    **METRIC_COLUMNS, **CONFIG_COLUMNS,
    "scenario_file": "str", "scenario_hash": "str", "params": "str", "wall_s": "float",
}
DTYPES = {"int": "Int64", "float": "Float64", "bool": "boolean", "str": "string"}


def _pd():
    try:
        import pandas as pd
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("kvsim sweep needs pandas and pyarrow: pip install 'kvsim[sweep]'") from e
    return pd


def _param_column(values: list[Any]):
    pd = _pd()
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pd.array(values, dtype="boolean")
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pd.array(values, dtype="Int64")
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pd.array([None if v is None else float(v) for v in values], dtype="Float64")
    return pd.array([None if v is None else v if isinstance(v, str) else yaml_scalar(v)
                     for v in values], dtype="string")


def build_table(rows: list[dict], param_keys: list[str]):
    """The typed table of ``rows`` (dicts as :func:`kvsim.sweep.points.run_point` returns)."""
    pd = _pd()
    rows = sorted(rows, key=lambda r: r["point_id"])
    params = [json.loads(r["params"]) for r in rows]
    columns: dict[str, Any] = {}
    for name in HEAD:
        columns[name] = pd.array([r.get(name) for r in rows], dtype=DTYPES[KINDS[name]])
    for key in param_keys:
        columns[key] = _param_column([p.get(key) for p in params])
    for name in (*MIDDLE, *METRIC_COLUMNS, *CONFIG_COLUMNS, *TAIL):
        kind = KINDS[name]
        values = [r.get(name) for r in rows]
        if kind == "float":
            values = [None if v is None else float(v) for v in values]
        columns[name] = pd.array(values, dtype=DTYPES[kind])
    return pd.DataFrame(columns)


def _py(value: Any) -> Any:
    pd = _pd()
    if value is None or (not isinstance(value, (list, dict, str)) and pd.isna(value)):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def table_rows(df) -> list[dict]:
    """Rows of a table read back (only the known columns; parameters come from ``params``)."""
    known = [c for c in KINDS if c in df.columns]
    return [{c: _py(v) for c, v in zip(known, values)}
            for values in df[known].itertuples(index=False, name=None)]


def read_table(path: str | Path):
    return _pd().read_parquet(path)


def previous_rows(out_dir: Path) -> dict[str, dict]:
    """Rows of earlier runs into ``out_dir``: the table, then the journal (later rows win)."""
    out: dict[str, dict] = {}
    table = out_dir / TABLE
    if table.exists():
        for row in table_rows(read_table(table)):
            out[row["point_id"]] = row
    journal = out_dir / JOURNAL
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interrupted run
            if isinstance(row, dict) and "point_id" in row:
                out[row["point_id"]] = row
    return out


class Journal:
    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / JOURNAL
        self._f = self.path.open("a", encoding="utf-8")

    def append(self, row: dict) -> None:
        self._f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        self._f.flush()

    def close(self, remove: bool = False) -> None:
        self._f.close()
        if remove:
            self.path.unlink(missing_ok=True)


def write_table(df, out_dir: Path) -> tuple[Path, Path]:
    """``results.parquet`` and ``results.csv``, each written to a temporary name and renamed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, write in ((TABLE, lambda p: df.to_parquet(p, index=False, engine="pyarrow")),
                        (CSV, lambda p: df.to_csv(p, index=False, lineterminator="\n"))):
        final = out_dir / name
        tmp = out_dir / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, final)
        paths.append(final)
    return paths[0], paths[1]


def comparable(df):
    """The table without ``wall_s`` (the one column that varies run to run)."""
    return df.drop(columns=["wall_s"]).reset_index(drop=True)
