"""Values compared bit for bit, and their differences described: used on the ranks and by the judge.

The rank side compares an input before and after a call (was it mutated?) and a
result when returned and after the next calls (did it change?); the judge
compares replicas and repeated runs.  Both describe a difference the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


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



def bitwise_equal(a: Any, b: Any) -> bool:
    """Same structure, shapes, dtypes and bits (``-0.0 != 0.0``; a NaN equals the same NaN)."""
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


def describe_difference(a: Any, b: Any) -> str:
    """How two values differ: element count, largest difference and the rows involved."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        differs = a.contiguous().reshape(-1).view(torch.uint8) != b.contiguous().reshape(-1).view(torch.uint8)
        per_element = differs.view(-1, a.element_size()).any(dim=1).view(a.shape)
        rows = per_element.reshape(-1, a.shape[-1]).any(dim=1) if a.dim() > 1 else per_element.reshape(1, -1).any(1)
        diff = (a.double() - b.double()).abs()
        return (f"{int(per_element.sum())} of {a.numel()} elements, max |diff| {float(diff.nan_to_num(0).max()):.3g},"
                f" rows {row_ranges(torch.nonzero(rows).flatten().tolist())}")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        parts = [f"{k}: {describe_difference(a[k], b[k])}" for k in a if k in b and not bitwise_equal(a[k], b[k])]
        return "; ".join(parts) or f"keys {sorted(a)} vs {sorted(b)}"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return "; ".join(f"[{i}] {describe_difference(x, y)}" for i, (x, y) in enumerate(zip(a, b))
                         if not bitwise_equal(x, y))
    return f"{a!r} vs {b!r}"
