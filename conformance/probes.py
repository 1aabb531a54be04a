"""Observe the collectives an implementation issues on this rank.

Two views are combined.  A torch dispatch mode sees every c10d and functional
collective op however the implementation called it.  Wrappers around the
``torch.distributed`` Python functions add whether each call asked for
``async_op`` (the dispatcher does not carry it), and record calls that never
reach the dispatcher (process groups written in Python, such as torch's
threaded one).  Both are per thread, so ranks running as threads do not see
each other.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

_PY_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
    "all_to_all_single", "broadcast", "reduce", "barrier", "all_gather_object",
    "broadcast_object_list", "gather", "scatter", "send", "recv", "isend", "irecv",
)
_local = threading.local()
_install_lock = threading.Lock()
_installed = False


@dataclass
class CollectiveCall:
    """One collective as seen on this rank."""

    op: str  # dispatcher op name, e.g. "c10d.allreduce_" or "_c10d_functional.all_reduce"
    shapes: list[tuple[int, ...]]
    api: str | None = None  # torch.distributed function, when called through it
    async_op: bool | None = None  # None: not called through torch.distributed's Python API

    @property
    def kind(self) -> str:
        """all_reduce / all_gather / reduce_scatter / other, whatever the API."""
        name = self.op.split(".")[-1]
        for kind, keys in (("all_reduce", ("allreduce", "all_reduce")),
                           ("all_gather", ("allgather", "all_gather")),
                           ("reduce_scatter", ("reduce_scatter",))):
            if any(k in name for k in keys):
                return kind
        return name

    @property
    def overlappable(self) -> bool:
        """Issued without blocking: ``async_op=True`` or a functional (lazy-wait) collective."""
        return self.async_op is True or self.op.startswith("_c10d_functional")


@dataclass
class CollectiveLog:
    calls: list[CollectiveCall] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[CollectiveCall]:
        return [c for c in self.calls if c.kind == kind]

    def __len__(self) -> int:
        return len(self.calls)


def _install_api_wrappers() -> None:
    """Wrap torch.distributed's Python collectives once per process (idempotent)."""
    global _installed
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    with _install_lock:
        if _installed:
            return
        for name in _PY_COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = _api_wrapper(name, original)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapped)
        _installed = True


def _api_wrapper(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log: CollectiveLog | None = getattr(_local, "log", None)
        if log is None:
            return original(*args, **kwargs)
        async_op = bool(kwargs.get("async_op", False))
        seen = len(log.calls)
        _local.api_stack.append((name, async_op))
        try:
            return original(*args, **kwargs)
        finally:
            _local.api_stack.pop()
            if len(log.calls) == seen:  # the dispatcher never saw it
                log.calls.append(CollectiveCall(f"api.{name}", _shapes(args), name, async_op))

    return wrapper


@contextmanager
def record_collectives() -> Iterator[CollectiveLog]:
    """Record every collective this thread issues inside the block."""
    from torch.utils._python_dispatch import TorchDispatchMode

    _install_api_wrappers()
    log = CollectiveLog()

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
                api = _local.api_stack[-1] if _local.api_stack else (None, None)
                log.calls.append(CollectiveCall(
                    op=f"{func.namespace}.{func._opname}",
                    shapes=_shapes(args),
                    api=api[0],
                    async_op=api[1],
                ))
            return func(*args, **(kwargs or {}))

    previous = getattr(_local, "log", None), getattr(_local, "api_stack", None)
    _local.log, _local.api_stack = log, []
    try:
        with _Mode():
            yield log
    finally:
        _local.log, _local.api_stack = previous


def _shapes(args: Any) -> list[tuple[int, ...]]:
    import torch

    found: list[tuple[int, ...]] = []
    for arg in args:
        items = arg if isinstance(arg, (list, tuple)) else [arg]
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append(tuple(item.shape))
            elif isinstance(item, (list, tuple)):
                found.extend(tuple(t.shape) for t in item if isinstance(t, torch.Tensor))
    return found
