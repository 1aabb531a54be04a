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

#: Device kinds whose backend takes torch's deterministic-algorithms flag as its own determinism switch: torch_npu
#: sets CANN's deterministic level from it (on: level 1, off: level 0), and ``torch_npu.npu.set_deterministic_level``
#: derives its level from it too, so flipping the flag around each call would reset a level the implementation
#: chose (``docs/DESIGN.md#harness``).
DEVICE_OWNS_THE_FLAG = ("npu",)
#: The factory ops whose fresh tensors are filled where the flag is the device's (what ATen's fill covers there).
_FACTORIES = ("empty.memory_format", "empty_strided.default", "empty_like.default", "empty_permuted.default",
              "new_empty.default", "new_empty_strided.default")


@contextlib.contextmanager
def poisoned_allocations(on: bool = True, device: str = "cpu") -> Iterator[None]:
    """Fresh tensors are filled with NaN (floats) / the largest value (ints) inside the block.

    On a CPU or a GPU, ATen fills every fresh allocation
    (``torch.utils.deterministic.fill_uninitialized_memory``, in force only
    while deterministic algorithms are on: switched on, warning only, for the
    block).  Where the device's backend owns that flag
    (:data:`DEVICE_OWNS_THE_FLAG`), the flag is never touched: the tensors the
    factory ops make inside the block (``torch.empty``, ``new_empty``,
    ``empty_like`` ...) are filled as they are made.
    """
    import torch
    import torch.utils.deterministic as det

    if not on:
        yield
        return
    if device.split(":", 1)[0] in DEVICE_OWNS_THE_FLAG:
        with _fills_fresh_tensors():
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


def _fills_fresh_tensors() -> Any:
    """A dispatch mode filling what the factory ops return (on every thread that carries it: the device's)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    factories = {getattr(getattr(torch.ops.aten, op.split(".")[0]), op.split(".")[1]) for op in _FACTORIES}

    class FillsFresh(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func in factories and isinstance(out, torch.Tensor) and out.numel():
                out.fill_(_poison(out.dtype))
            return out

    return FillsFresh()


def _poison(dtype: Any) -> Any:
    """What ATen fills a fresh tensor of ``dtype`` with: NaN, the largest integer, or True."""
    import torch

    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return True if dtype == torch.bool else torch.iinfo(dtype).max


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
