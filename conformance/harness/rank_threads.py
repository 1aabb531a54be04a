"""Which rank each thread of a process works for.

A rank's code runs on more threads than its task thread: on an accelerator the
autograd engine runs every backward on a per-device worker thread, gloo
completes futures (and runs their callbacks) on its own threads, and an
implementation may start helpers.  Progress evidence, completions, warnings
and logs belong to the rank those threads work for, never to whichever thread
happened to run them (``docs/DESIGN.md#progress-evidence``).

* :func:`rank_thread` marks the task thread of a rank while its task runs
  (:func:`~conformance.harness.case.run_on_rank` does, on every launcher);
* :func:`working_for` marks a helper thread the harness starts for a rank
  (the CPU emulation of the device thread, :mod:`conformance.harness.device_thread`);
* :func:`rank_of` answers for any thread: its own rank thread, the one it works
  for, or -- in a process that runs one rank (every launcher but the threaded
  one) -- that rank: every thread of a rank's process is the rank's.  Under
  the threaded launcher (several rank threads in one process) a thread nobody
  adopted belongs to no rank.

A rank thread may name a *carry*: a context a helper thread working for it
enters around the rank's code, to take over what the launcher keeps per thread
(the threaded launcher's process group lives in the rank thread's Python
thread-locals).  Imports nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

_lock = threading.Lock()
#: Rank task thread ident -> its carry (None: nothing to take over), for every task running in this process.
_rank_threads: dict[int, Callable[[], AbstractContextManager[None]] | None] = {}
#: Helper thread ident -> (the rank thread it works for, its native id: where its CPU time is read).
_helpers: dict[int, tuple[int, int]] = {}


@contextmanager
def rank_thread(carry: Callable[[], AbstractContextManager[None]] | None = None) -> Iterator[None]:
    """The current thread is a rank's task thread inside the block; its helpers run its code inside ``carry()``."""
    ident = threading.get_ident()
    with _lock:
        outer = _rank_threads.get(ident, _MISSING)
        _rank_threads[ident] = carry
    try:
        yield
    finally:
        with _lock:
            if outer is _MISSING:
                _rank_threads.pop(ident, None)
            else:
                _rank_threads[ident] = outer  # type: ignore[assignment]


_MISSING = object()


@contextmanager
def working_for(rank: int | None) -> Iterator[None]:
    """The current (helper) thread works for rank thread ``rank`` inside the block (None: for no known rank)."""
    ident = threading.get_ident()
    if rank is None or rank == ident:
        yield
        return
    with _lock:
        _helpers[ident] = (rank, threading.get_native_id())
    try:
        yield
    finally:
        with _lock:
            _helpers.pop(ident, None)


def rank_of(ident: int | None = None) -> int | None:
    """The rank thread that thread ``ident`` (default: this one) works for; None where no rank is known.

    A process with a single rank thread (or none: code run in process) gives
    every thread to it, helpers it never adopted included (gloo's callback
    threads, an accelerator's autograd device thread).
    """
    ident = threading.get_ident() if ident is None else ident
    if ident in _rank_threads:
        return ident
    helper = _helpers.get(ident)
    if helper is not None:
        return helper[0]
    if len(_rank_threads) == 1:
        return next(iter(_rank_threads))
    return None


def works_for(ident: int, rank: int) -> bool:
    """Whether thread ``ident`` works for rank thread ``rank`` (a process without rank threads: any thread does)."""
    if not _rank_threads:
        return True
    return rank_of(ident) == rank


def helpers_of(rank: int) -> list[tuple[int, int]]:
    """The helper threads working for rank thread ``rank`` now: (ident, native id) of each."""
    with _lock:
        return [(helper, native) for helper, (owner, native) in _helpers.items() if owner == rank]


def carry_of(rank: int | None) -> Callable[[], AbstractContextManager[None]] | None:
    """The context a helper of rank thread ``rank`` runs its code in (None: none)."""
    return None if rank is None else _rank_threads.get(rank)
