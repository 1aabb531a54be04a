"""Futures of recorded launches: one got from a Work (``get_future()``), chained with ``then(...)`` or gathered by
``torch.futures.collect_all`` completes, when waited on, the calls its sources do; a ``then`` /
``add_done_callback`` callback registered inside a recording runs with its mode, on whichever thread completes
the future."""

from __future__ import annotations

import functools
import threading
from typing import Any

from conformance.harness import rank_threads
from conformance.harness.probes.collective_log import CollectiveLog
from conformance.harness.probes.recording_mode import mode_of
from conformance.harness.probes.recordings import current, live
from conformance.harness.probes.unseen_work import unseen_mode
from conformance.harness.probes.waits import calls_of, in_callback


def patch_futures(work: Any, c: Any) -> None:
    """A future got from a recorded Work, chained with ``then`` or gathered by ``collect_all`` completes the
    calls its sources do when waited on; a callback registered inside a recording runs with its mode."""
    original_get_future = work.get_future

    # Not named get_future: a Work written in Python (a Python backend's, the emulated NPU's) reaches its own
    # get_future through pybind11, which skips the Python override when the calling frame has the method's name
    # and this object as its first argument (taking it for the override's own call of the base), and the base
    # raises "Work::getFuture not implemented".
    def probed_get_future(self: Any) -> Any:
        future = original_get_future(self)
        for log, calls in calls_of(self):
            log._waits_for(future, calls)
        return future

    work.get_future = probed_get_future
    original_then, original_add = c.Future.then, c.Future.add_done_callback

    def then(self: Any, callback: Any) -> Any:
        chain = _Chain()
        chained = original_then(self, _callback(callback, chain))
        for log, calls in calls_of(self):
            log._waits_for(chained, calls)
        chain.bind(chained)
        return chained

    c.Future.then = then
    c.Future.add_done_callback = lambda self, callback: original_add(self, _callback(callback, None))
    original_collect = c._collect_all

    def collect_all(futures: Any) -> Any:
        gathered = original_collect(futures)
        for recording in list(live):
            calls = tuple(i for future in futures for i in recording.log._calls_of(future))
            recording.log._waits_for(gathered, calls)
        return gathered

    c._collect_all = collect_all


class _Chain:
    """The future ``then`` returns, and what the waits inside its callback would have completed: waiting on that
    future completes them (the callback, which waited for them, has returned).  The callback may run before
    ``then`` returns (a future already done: inline, as device backends run it), so what it left is held until the
    future is known."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._future: Any = None
        self._left: list[tuple[CollectiveLog, tuple[int, ...]]] = []

    def add(self, completed: list[tuple[CollectiveLog, tuple[int, ...]]]) -> None:
        with self._lock:
            if self._future is None:
                self._left.extend(completed)
                return
        for log, calls in completed:
            log._waits_for(self._future, calls)

    def bind(self, future: Any) -> None:
        with self._lock:
            self._future, left, self._left = future, self._left, []
        for log, calls in left:
            log._waits_for(future, calls)


def _callback(callback: Any, chain: _Chain | None) -> Any:
    """``callback`` as it runs on whichever thread completes its future, decided when it runs: with the mode of the
    recording it was registered in while that one is live; else, while a recording of its rank is live and the
    thread carries none, watched (its collectives and matmuls noted as unrecorded); a wait inside it is never the
    program's, but waiting on the future ``then`` chained (``chain``) completes what it waited for."""
    registered_in, registered_by = current(), rank_threads.rank_of()

    @functools.wraps(callback)
    def run(future: Any) -> Any:
        ident = threading.get_ident()
        outer = in_callback.get(ident)
        inside: list[tuple[CollectiveLog, tuple[int, ...]]] = []
        in_callback[ident] = inside
        try:
            if current() is None and registered_in is not None and registered_in in live:
                with mode_of(registered_in):
                    return callback(future)
            rank = registered_by if registered_by is not None else rank_threads.rank_of()
            if current() is None and any(r.mine(rank) for r in list(live)):
                with unseen_mode()(f"a future's callback (run while no recording of its own is), on thread "
                                    f"{threading.current_thread().name!r}", rank):
                    return callback(future)
            return callback(future)
        finally:
            if outer is None:
                del in_callback[ident]
            else:
                in_callback[ident] = outer
            if chain is not None and inside:
                chain.add(inside)

    return run
