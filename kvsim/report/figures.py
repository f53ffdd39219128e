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


def save(fig, path: Path, palette: int | None = None) -> None:
    """Write ``fig`` as a PNG without time stamps (the same figure gives the same bytes).
    ``palette``: quantise to that many colours first (a line plot loses nothing visible and
    shrinks about four times: for figures committed to the repository)."""
    fig.tight_layout()
    if palette is None:
        fig.savefig(path, format="png", metadata=PNG_METADATA)
    else:
        import io

        from PIL import Image

        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata=PNG_METADATA)
        image = Image.open(buf).convert("RGB").quantize(colors=palette,
                                                        method=Image.Quantize.MEDIANCUT)
        image.save(path, format="PNG", optimize=True)
    plt.close(fig)
