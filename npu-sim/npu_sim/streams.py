"""Streams and events of the emulated device, and when a queued collective completes.

Kernels run synchronously on the host, so a stream is bookkeeping: its work is always done, ``wait_stream``
and ``wait_event`` have nothing to wait for, ``query()`` is True, and an event's timing is the host's
clock when it was recorded.  Collectives are the exception: like HCCL's, they run on a stream of their own
and a collective's result is not in its output until something waits for it (:mod:`npu_sim.hccl`).
What completes one here is what makes the compute stream wait for HCCL's on a real device:
``Work.wait()`` / ``Work.synchronize()``, taking its future, and :func:`synchronize_device`
(``torch.npu.synchronize()``, which synchronizes every stream).  A compute stream's or event's
``synchronize()`` does not: on the device that stream never waited for the collective.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Protocol

import torch

from npu_sim import runtime


class Pending(Protocol):
    """Queued work that completes when the device is synchronized."""

    def complete(self) -> None: ...


_PENDING: dict[int, Pending] = {}
_PENDING_LOCK = threading.Lock()
_IDS = itertools.count(1)


def enqueue(work: Pending) -> None:
    with _PENDING_LOCK:
        _PENDING[id(work)] = work


def dequeue(work: Pending) -> None:
    with _PENDING_LOCK:
        _PENDING.pop(id(work), None)


def pending() -> list[Pending]:
    """Queued work not yet completed, oldest first."""
    with _PENDING_LOCK:
        return list(_PENDING.values())


def synchronize_device() -> None:
    """Everything queued on the device completes (``torch.npu.synchronize()``)."""
    runtime.start()
    for work in pending():
        work.complete()


def clear_after_fork() -> None:
    """A forked child owns none of its parent's queued work."""
    with _PENDING_LOCK:
        _PENDING.clear()


class Stream(torch.Stream):
    """A stream of the emulated device (bookkeeping: its kernels have run by the time they return)."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        runtime.check_device_index(runtime.device_index(device))
        return super().__new__(cls, device="npu", priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self._id = next(_IDS)

    @property
    def stream_id(self) -> int:  # torch's Python guard gives every stream id 0
        return self._id

    def wait_stream(self, stream: torch.Stream) -> None:
        """Nothing to wait for: the other stream's kernels have run."""

    def wait_event(self, event: torch.Event) -> None:
        """Nothing to wait for: the event's work has run."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """This stream's kernels have run; collectives not waited for stay queued (see the module docstring)."""

    def __enter__(self) -> Stream:
        self._previous = current_stream()
        set_stream(self)
        return self

    def __exit__(self, *exc) -> None:
        set_stream(self._previous)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._id == self._id

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("npu-stream", self._id))

    def __repr__(self) -> str:
        return f"<npu_sim Stream device=npu:0 id={self._id}>"


class Event(torch.Event):
    """An event of the emulated device; recording stamps the host clock (kernels before it have run)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, "npu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._recorded_ns: int | None = None

    def record(self, stream: torch.Stream | None = None) -> None:
        runtime.start()
        self._recorded_ns = time.perf_counter_ns()

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Nothing to wait for: the recorded work has run."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """The recorded work has run."""

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's record and ``end_event``'s (both created with ``enable_timing``)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_ns is None or end_event._recorded_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_ns - self._recorded_ns) / 1e6

    def __repr__(self) -> str:
        state = "recorded" if self._recorded_ns is not None else "not recorded"
        return f"<npu_sim Event {state}>"


_CURRENT = threading.local()
_DEFAULT: list[Stream] = []


def default_stream(device=None) -> Stream:
    runtime.check_device_index(runtime.device_index(device))
    if not _DEFAULT:
        _DEFAULT.append(Stream())
    return _DEFAULT[0]


def current_stream(device=None) -> Stream:
    """This thread's current stream (the default stream until one is set)."""
    runtime.check_device_index(runtime.device_index(device))
    stream = getattr(_CURRENT, "stream", None)
    return stream if stream is not None else default_stream()


def set_stream(stream: Stream | None) -> None:
    if stream is not None:
        _CURRENT.stream = stream


class StreamContext:
    """``torch.npu.stream(s)``: ``s`` is this thread's current stream inside the block (None: no change)."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream
        self.previous: Stream | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.previous = current_stream()
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            set_stream(self.previous)


def record_stream_handler(func, args, kwargs):
    """``Tensor.record_stream``: the memory is the host's and kernels are synchronous; nothing to record."""
    return None
