"""Every documented wait, patched on its class once per process: a wait on a recorded launch's handle marks it
waited, whoever holds it and on whichever thread, and every wait that returns counts as a completion.

``Work.wait`` / ``synchronize`` / ``result``, ``Future.wait`` / ``value``, a
poll of ``Work.is_completed`` or ``Future.done`` that answers True; a group
creation's rendezvous counts too (:func:`count_completions`).
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

from conformance.harness.completions import COMPLETED
from conformance.harness.probes.collective_log import CollectiveLog
from conformance.harness.probes.recordings import install_lock, live

_waits_patched = False  #: whether the waits are patched (counting completions; :func:`count_completions`)
#: Threads running a future's callback now -> what the waits inside it would have completed (per recording's log):
#: a wait there is no wait of the program (the future is done); waiting on the future the callback chains is.
in_callback: dict[int, list[tuple[CollectiveLog, tuple[int, ...]]]] = {}


def handle_waited(handle: Any) -> None:
    """``handle`` (a Work or a Future) was waited on: its calls complete in every recording that launched them,
    whichever thread waited."""
    deferred = in_callback.get(threading.get_ident())
    if deferred is not None:  # a callback runs because its future is done: the program has not waited (yet)
        deferred.extend(calls_of(handle))
        return
    for recording in list(live):
        recording.log._work_waited(handle)


def calls_of(handle: Any) -> list[tuple[CollectiveLog, tuple[int, ...]]]:
    """The calls waiting on ``handle`` completes, per live recording."""
    found = []
    for recording in list(live):
        calls = recording.log._calls_of(handle)
        if calls:
            found.append((recording.log, calls))
    return found


def count_completions() -> None:
    """Patch the waits of ``Work`` and ``Future`` on the class, once per process: every wait that returns counts in
    :data:`COMPLETED`, and marks the calls of a recorded handle waited.

    So does every rendezvous of a group creation (torch's private helpers:
    Megatron creates 20 or more groups a case, and on a loaded machine that
    takes seconds with no ``Work`` at all).  Cheap (one counter), and in force
    from then on, recording or not: the case clock's evidence
    (``docs/DESIGN.md#progress-evidence``).  No public torch.distributed
    function changes identity.
    """
    global _waits_patched
    import torch
    import torch.distributed as dist

    with install_lock:
        if _waits_patched:
            return
        _patch_waits(dist.distributed_c10d.Work, ("wait", "synchronize", "result"), ("is_completed",),
                     python_polls=True)
        _patch_waits(torch._C.Future, ("wait", "value"), ("done",))
        for name in _RENDEZVOUS:
            original = getattr(dist.distributed_c10d, name, None)
            if original is not None:
                setattr(dist.distributed_c10d, name, _counted(original))
        _waits_patched = True


#: torch's private steps of creating a process group: store rendezvous every member completes (each counts).
_RENDEZVOUS = ("_new_process_group_helper", "_store_based_barrier")


def _counted(original: Any) -> Any:
    """``original``, counting each return in :data:`COMPLETED` (a group creation is a rendezvous of its ranks)."""

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        COMPLETED.note()
        return result

    return counted


def _patch_waits(cls: Any, waits: tuple[str, ...], polls: tuple[str, ...], *, python_polls: bool = False) -> None:
    """Patch ``waits`` and ``polls`` on ``cls`` (a Work, a Future): a handle waited on marks the calls it completes
    waited (a poll only when it answers True), and every wait that returns counts in :data:`COMPLETED` (a poll
    does not: polling a finished handle again is no new progress).  ``python_polls``: a poll of a subclass
    written in Python that hands it on here is answered by that subclass (:func:`_own_poll`)."""
    for method in (*waits, *polls):
        original = getattr(cls, method, None)
        if original is None:
            continue
        poll = method in polls

        def patched(self: Any, *args: Any, _original: Any = original, _poll: bool = poll, _name: str = method,
                    **kwargs: Any) -> Any:
            own = _own_poll(self, _name, cls) if _poll and python_polls else None
            result = _original(self, *args, **kwargs) if own is None else own()
            if live and (not _poll or result):
                handle_waited(self)
            if not _poll:
                COMPLETED.note()
            return result

        setattr(cls, method, patched)


#: The polls a Work's own override is answering, on this thread: ``(id(work), method)`` (:func:`_own_poll`).
_answering = threading.local()


def _own_poll(handle: Any, method: str, cls: Any) -> Callable[[], Any] | None:
    """The answer of a Work written in Python (a Python backend's, the emulated NPU's hccl Work) to a poll it hands on
    to what is patched on ``cls`` so that wrappers see it: torch's own method answers for the C++ base class there
    (``is_completed``: never).  None for torch's own Works, and while the override answers (one calling its base)."""
    own = getattr(type(handle), method, None)
    polls = _answering.__dict__.setdefault("polls", set())
    key = (id(handle), method)
    if not isinstance(own, types.FunctionType) or own is getattr(cls, method, None) or key in polls:
        return None

    def answer() -> Any:
        polls.add(key)
        try:
            return own(handle)
        finally:
            polls.discard(key)

    return answer
