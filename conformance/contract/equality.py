"""Values compared bit for bit, and their differences described: used on the ranks and by the judge.

The rank side compares an input before and after a call (was it mutated?) and a
result when returned and after the next calls (did it change?); the judge
compares replicas and repeated runs.  Both describe a difference the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.contract.layouts import Split

if TYPE_CHECKING:
    pass


def row_ranges(rows: Sequence[int], limit: int = 8) -> str:
    """``[3, 4, 5, 9]`` as ``"3-5, 9"`` (at most ``limit`` ranges, then a count)."""
    spans: list[list[int]] = []
    for row in sorted(set(rows)):
        if spans and row == spans[-1][1] + 1:
            spans[-1][1] = row
        else:
            spans.append([row, row])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit])
    return text + (f", ... ({len(spans) - limit} more ranges)" if len(spans) > limit else "")


def _indices(flags: Any) -> list[int]:
    return [int(i) for i in np.flatnonzero(np.asarray(flags))]


def _cells(wrong: np.ndarray, *, vector: bool) -> str:
    """``"rows 3-5, columns 0-7"`` for a 2-D block of flags (columns only when not all of them are wrong)."""
    rows, cols = _indices(wrong.any(axis=1)), _indices(wrong.any(axis=0))
    if vector:
        return f"elements {row_ranges(cols)}"
    text = f"rows {row_ranges(rows)}"
    if len(cols) < wrong.shape[1]:
        text += f", columns {row_ranges(cols)}"
    return text


def wrong_cells(wrong: Any, split: Split | None = None, tp: int = 1) -> str:
    """Where ``wrong`` (flags over a global tensor) is set, named per rank in the rank's own shard.

    Rows split over ranks name each rank's rows; columns split over ranks
    name each rank's rows *and* its own columns (with the global ones), since
    every rank holds every row: ``"rank 0 rows 0-63, its columns 3-5 of 48
    (global 3-5); rank 1 rows 10, its columns 0 of 48 (global 48)"``.  A
    replicated or partial tensor (or a split the size does not divide) names
    global rows and columns.
    """
    import torch

    flags = np.asarray(wrong.cpu() if isinstance(wrong, torch.Tensor) else wrong, dtype=bool)
    vector = flags.ndim <= 1
    grid = flags.reshape(1, -1) if vector else flags.reshape(-1, flags.shape[-1])
    if not grid.any():
        return "nowhere"
    rows, cols = grid.shape
    if split in (Split.SEQ, Split.ROWS) and not vector and rows % tp == 0 and tp > 1:
        per = rows // tp
        return "; ".join(f"rank {r} " + _cells(grid[r * per:(r + 1) * per], vector=False)
                         for r in range(tp) if grid[r * per:(r + 1) * per].any())
    if split in (Split.LAST, Split.COLS) and cols % tp == 0 and tp > 1:
        per, parts = cols // tp, []
        for r in range(tp):
            block = grid[:, r * per:(r + 1) * per]
            if not block.any():
                continue
            local = _indices(block.any(axis=0))
            where = f"elements {row_ranges(local)}" if vector else (
                f"rows {row_ranges(_indices(block.any(axis=1)))}, its columns {row_ranges(local)}")
            parts.append(f"rank {r} {where} of {per} (global {row_ranges([r * per + c for c in local])})")
        return "; ".join(parts)
    return _cells(grid, vector=vector)


def bitwise_equal(a: Any, b: Any) -> bool:
    """Same structure, shapes, dtypes and bits (``-0.0 != 0.0``; a NaN equals the same NaN)."""
    import torch

    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
            return False
        return bool(torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                b.contiguous().reshape(-1).view(torch.uint8)))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            bitwise_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def describe_difference(a: Any, b: Any, split: Split | None = None, tp: int = 1) -> str:
    """How two values differ: element count, largest difference and where (:func:`wrong_cells`)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        differs = a.contiguous().reshape(-1).view(torch.uint8) != b.contiguous().reshape(-1).view(torch.uint8)
        per_element = differs.view(-1, a.element_size()).any(dim=1).view(a.shape)
        diff = (a.double() - b.double()).abs()
        return (f"{int(per_element.sum())} of {a.numel()} elements, max |diff| {float(diff.nan_to_num(0).max()):.3g},"
                f" {wrong_cells(per_element, split, tp)}")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        parts = [f"{k}: {describe_difference(a[k], b[k])}" for k in a if k in b and not bitwise_equal(a[k], b[k])]
        return "; ".join(parts) or f"keys {sorted(a)} vs {sorted(b)}"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return "; ".join(f"[{i}] {describe_difference(x, y)}" for i, (x, y) in enumerate(zip(a, b))
                         if not bitwise_equal(x, y))
    return f"{a!r} vs {b!r}"
