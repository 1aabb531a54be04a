"""PNG figures for the report: error distribution, |diff| heat-map, pipeline lanes.

matplotlib is optional (the ``report`` extra) and slow to import, so it is
imported on the first figure.  Figures are drawn on an Agg canvas directly,
without pyplot, so no global backend is switched in the test process.
Every function returns PNG bytes, or None when matplotlib is not installed.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Interval = tuple[float, float]

#: Largest heat-map grid drawn; bigger tensors are max-pooled down to it.
HEATMAP_CELLS = 256
#: Elements above which the histogram uses an evenly strided sample.
HISTOGRAM_SAMPLE = 1 << 22
_DPI = 90
_PALETTE = 128


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float, *, margins: dict[str, float] | None = None) -> Any:
    """A figure on its own Agg canvas; fixed ``margins`` skip the (costly) constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI, layout=None if margins else "constrained")
    if margins:
        fig.subplots_adjust(**margins)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> bytes:
    """A paletted PNG: a third of the RGBA size, which the single-file report embeds many times."""
    from PIL import Image  # matplotlib's own dependency

    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(_PALETTE, method=Image.Quantize.MEDIANCUT).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def error_histogram(abs_diff: np.ndarray, bound: np.ndarray, *, title: str) -> bytes | None:
    """Histogram of log10(|diff| / bound) per element; the bound is the line at 0."""
    if not available():
        return None
    diff, bnd = np.ravel(abs_diff), np.ravel(bound)
    sampled = diff.size > HISTOGRAM_SAMPLE
    if sampled:
        step = math.ceil(diff.size / HISTOGRAM_SAMPLE)
        diff, bnd = diff[::step], bnd[::step]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bnd > 0, diff / bnd, np.where(diff > 0, np.inf, 0.0))
    exact = int((ratio == 0).sum())
    unbounded = int((~np.isfinite(ratio)).sum())
    logs = np.log10(ratio[(ratio > 0) & np.isfinite(ratio)])
    fig = _figure(6.0, 2.8, margins={"left": 0.12, "right": 0.98, "bottom": 0.17, "top": 0.9})
    ax = fig.add_subplot()
    if logs.size:
        from matplotlib.ticker import FuncFormatter, NullLocator

        # Drawn often, so cheaply: one patch (not one per bin), no minor ticks, plain labels
        # (the default 10^n ones go through mathtext).
        ax.hist(logs, bins=60, color="#4878a8", log=True, histtype="stepfilled")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.axvline(0.0, color="#c03030", linestyle="--", label="bound")
    ax.set_xlabel("log10(|diff| / bound)   (> 0 violates)")
    ax.set_ylabel("elements")
    notes = [f"{np.size(abs_diff)} elements", f"{exact} exact"]
    notes += ([f"{unbounded} inf/nan"] if unbounded else []) + (["strided sample"] if sampled else [])
    ax.set_title(f"{title}  ({', '.join(notes)})", fontsize=9, y=1.0)  # fixed y: no layout pass
    ax.legend(loc="upper right", fontsize=8)
    return _png(fig)


def as_matrix(a: np.ndarray) -> np.ndarray:
    """A 2-D view: leading dims flattened into rows (a vector is one row)."""
    a = np.asarray(a)
    if a.ndim == 0:
        return a.reshape(1, 1)
    return a.reshape(-1, a.shape[-1])


def _max_pool(a: np.ndarray, cells: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Block maxima so the grid is at most ``cells`` x ``cells`` (keeps every outlier visible)."""
    rows, cols = a.shape
    fr, fc = math.ceil(rows / cells), math.ceil(cols / cells)
    if fr == fc == 1:
        return a, (1, 1)
    padded = np.full((math.ceil(rows / fr) * fr, math.ceil(cols / fc) * fc), -np.inf)
    padded[:rows, :cols] = a
    pooled = padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(axis=(1, 3))
    return pooled, (fr, fc)


def diff_heatmap(abs_diff: np.ndarray, bound: np.ndarray, *, title: str) -> bytes | None:
    """|diff| (log10) next to where it exceeds the bound, on the tensor's 2-D view."""
    if not available():
        return None
    diff = as_matrix(abs_diff).astype(np.float64)
    over = (diff > as_matrix(bound)).astype(np.float64)
    violations = int(over.sum())
    rows, cols = diff.shape
    with np.errstate(divide="ignore"):
        logs = np.log10(np.where(np.isfinite(diff), diff, np.finfo(np.float64).max))
    logs, factor = _max_pool(logs, HEATMAP_CELLS)
    over, _ = _max_pool(over, HEATMAP_CELLS)
    shown = np.ma.masked_invalid(np.where(np.isneginf(logs), np.nan, logs))
    fig = _figure(9.0, 3.6)
    left, right = fig.subplots(1, 2)
    extent = (0, cols, rows, 0)  # axes in tensor rows / columns, whatever the pooling
    image = left.imshow(shown, aspect="auto", interpolation="nearest", cmap="viridis", extent=extent)
    fig.colorbar(image, ax=left, label="log10 |diff|")
    left.set_title("|diff| (white: exact)", fontsize=9)
    right.imshow(over, aspect="auto", interpolation="nearest", cmap="Reds", vmin=0, vmax=1, extent=extent)
    right.set_title(f"|diff| > bound: {violations} elements", fontsize=9)
    for ax in (left, right):
        ax.set_xlabel("column")
        ax.set_ylabel("row (leading dims flattened)")
    pooled = f", max over {factor[0]}x{factor[1]} blocks" if factor != (1, 1) else ""
    fig.suptitle(title + pooled, fontsize=10)
    return _png(fig)


def lanes(rows: Mapping[str, Sequence[Interval]], *, title: str, unit: str = "us") -> bytes | None:
    """Gantt chart: one horizontal lane per entry of ``rows``, top to bottom, in ``unit``."""
    if not available():
        return None
    labels = list(rows)
    height = 1.0 + 0.45 * len(labels)
    fig = _figure(9.0, height, margins={"left": 0.15, "right": 0.98, "bottom": 0.55 / height,
                                        "top": 1 - 0.3 / height})
    ax = fig.add_subplot()
    colours = ("#4878a8", "#e08040")
    for y, label in enumerate(reversed(labels)):
        spans = [(start, end - start) for start, end in rows[label]]
        colour = colours[0] if "matmul" in label else colours[1]
        ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=colour, edgecolors="white", linewidth=0.5)
        if len(spans) <= 16:
            for i, (start, width) in enumerate(spans):
                ax.text(start + width / 2, y, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(labels)), list(reversed(labels)), fontsize=8)
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(left=0)
    ax.set_title(title, fontsize=9)
    return _png(fig)
