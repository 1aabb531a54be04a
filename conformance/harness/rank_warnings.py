"""What the implementation warned about, rank by rank: UserWarnings and WARNING+ log records of the threads that
work for one rank, where ranks as threads share one process's warnings machinery."""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from conformance.harness import rank_threads


@contextlib.contextmanager
def observed_warnings() -> Iterator[list[str]]:
    """What the implementation warned about inside the block: UserWarnings and WARNING+ log records, of this rank.

    Of every thread that works for this thread's rank
    (:mod:`conformance.harness.rank_threads`: its device thread, its helpers;
    every thread of a process rank), and of no other rank's (ranks as threads
    share one process).  torch's own notices about the deterministic-algorithms
    switch (set while fresh allocations are poisoned) are not the
    implementation's and are left out.
    """
    seen: list[str] = []
    rank = rank_threads.rank_of()
    handler = logging.Handler(logging.WARNING)
    handler.addFilter(lambda record: record.thread is None or rank is None
                      or rank_threads.works_for(record.thread, rank))
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    root = logging.getLogger()
    root.addHandler(handler)
    caught: list[warnings.WarningMessage] = []
    try:
        with _WARNINGS.observing(rank, caught):
            yield seen
    finally:
        root.removeHandler(handler)
        seen.extend(str(w.message) for w in caught if issubclass(w.category, UserWarning)
                    and "use_deterministic_algorithms" not in str(w.message))


class _WarningRoutes:
    """One process-wide ``warnings.showwarning`` while any rank observes: each warning goes to the observer of
    the rank its thread works for (``warnings.catch_warnings`` swaps process-wide state: ranks as threads, each
    catching its own, took each other's warnings and restored each other's filters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._observers: dict[int | None, list[list[warnings.WarningMessage]]] = {}
        #: While any rank observes: the process's warnings state saved on entry, and its ``showwarning`` then.
        self._saved: tuple[Any, Any] | None = None

    @contextlib.contextmanager
    def observing(self, rank: int | None, sink: list[warnings.WarningMessage]) -> Iterator[None]:
        with self._lock:
            if self._saved is None:
                saving = warnings.catch_warnings()  # filters and showwarning, restored as the warnings module does
                saving.__enter__()
                self._saved = (saving, warnings.showwarning)
                warnings.simplefilter("always")  # every warning, however often the same line warned before
                warnings.showwarning = self._show
            self._observers.setdefault(rank, []).append(sink)
        try:
            yield
        finally:
            with self._lock:
                sinks = self._observers[rank]
                sinks.remove(sink)
                if not sinks:
                    del self._observers[rank]
                if not self._observers and self._saved is not None:
                    self._saved[0].__exit__(None, None, None)
                    self._saved = None

    def _show(self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
              line: str | None = None) -> None:
        rank = rank_threads.rank_of()
        with self._lock:
            sinks = self._observers.get(rank) or (self._observers.get(None) if rank is not None else None)
            saved = self._saved
        if sinks:
            sinks[-1].append(warnings.WarningMessage(message, category, filename, lineno, file, line))
        elif saved is not None:
            saved[1](message, category, filename, lineno, file, line)  # another rank's, or no rank's: as before


_WARNINGS = _WarningRoutes()
