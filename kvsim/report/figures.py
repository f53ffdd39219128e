"""Matplotlib plumbing shared by every report: headless backend, deterministic PNG files."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# No timestamps or software versions in the files, so equal results give equal bytes.
PNG_METADATA = {"Software": None}


def new_figure(width: float = 8.0, height: float = 4.5, rows: int = 1, cols: int = 1):
    fig, ax = plt.subplots(rows, cols, figsize=(width, height), dpi=100)
    return fig, ax


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png", metadata=PNG_METADATA)
    plt.close(fig)
