"""Rank-side memory discipline: poisoned fresh allocations, copies, and who shares storage with whom.

Rows an implementation never writes must not pass by luck, so fresh
allocations are poisoned while it runs; results and inputs are copied to be
compared after later calls; and two values share memory when their storage
spans overlap (a result aliasing another call's result, or an input).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


@contextlib.contextmanager
def poisoned_allocations(on: bool = True) -> Iterator[None]:
    """Fresh tensors are filled with NaN (floats) / the largest value (ints) inside the block."""
    import torch
    import torch.utils.deterministic as det

    if not on:
        yield
        return
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


def tensors_of(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def _span(t: Any) -> tuple[int, int]:
    start = t.data_ptr()
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1 if t.numel() else 0
    return start, start + extent * t.element_size()


def overlaps(a: Any, b: Any) -> bool:
    (s1, e1), (s2, e2) = _span(a), _span(b)
    return a.numel() > 0 and b.numel() > 0 and s1 < e2 and s2 < e1


def to_cpu(value: Any) -> Any:
    """Results travel to the test process on the host (it need not have the device's runtime)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach() if value.device.type == "meta" else value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value


def to_device(tensors: Mapping[str, Any], device: str) -> dict[str, Any]:
    """Inputs made on the host from a seed, placed on the rank's device (its collectives take no other tensors)."""
    return {name: t if t is None else t.to(device) for name, t in tensors.items()}


def clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    return value
