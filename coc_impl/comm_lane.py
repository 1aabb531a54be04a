"""Where the overlap engine's collectives run and how their results are waited for.

Collectives are asynchronous (``async_op=True`` work handles).  On CUDA / NPU
they are launched on a dedicated communication stream, ordered against the
compute stream with events; on CPU they run inline (gloo has its own threads).
A pipeline returns an :class:`InFlight`, so the caller decides how late it waits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

__all__ = ["CommLane", "InFlight", "Pending"]

T = TypeVar("T")


class Pending(Protocol):
    """A launched collective (a ``dist.Work`` or a reducer's own handle)."""

    def wait(self) -> Any: ...


_COMM_STREAMS: dict[torch.device, Any] = {}


class CommLane:
    """Where collectives run: a side stream on CUDA / NPU, inline on CPU."""

    def __init__(self, device: torch.device) -> None:
        self._module: Any = None  # torch.cuda / torch.npu
        self._stream: Any = None
        if device.type in ("cuda", "npu"):
            self._module = torch.get_device_module(device)
            if device not in _COMM_STREAMS:
                _COMM_STREAMS[device] = self._module.Stream(device=device)
            self._stream = _COMM_STREAMS[device]

    def launch(self, start: Callable[[], Pending], *tensors: torch.Tensor) -> Pending:
        """Start a collective after the compute work queued so far on ``tensors``."""
        if self._stream is None:
            return start()
        ready = self._module.Event()
        ready.record(self._module.current_stream())
        self._stream.wait_event(ready)
        with self._module.stream(self._stream):
            for t in tensors:
                t.record_stream(self._stream)  # keep the allocator from reusing it early
            return start()

    def wait(self, pending: Pending) -> None:
        """Block until ``pending`` finished and order later compute after it."""
        if self._stream is None:
            pending.wait()
            return
        with self._module.stream(self._stream):
            pending.wait()
        done = self._module.Event()
        done.record(self._stream)
        self._module.current_stream().wait_event(done)


@dataclass
class InFlight(Generic[T]):
    """A result whose collectives may still be running; :meth:`wait` finishes it."""

    result: T
    _lane: CommLane
    _pending: list[Pending] = field(default_factory=list)
    _finish: Callable[[], None] | None = None
    _done: bool = False

    def wait(self) -> T:
        """Wait for every collective (in launch order) and return the result."""
        if not self._done:
            for pending in self._pending:
                self._lane.wait(pending)
            if self._finish is not None:
                self._finish()
            self._done = True
        return self.result
