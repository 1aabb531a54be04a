"""Work on a thread no recording reaches: noted in the recordings of its rank, naming the thread, never recorded.

What no recording's mode reaches -- a helper thread, or a callback
registered outside the recording, that issues a collective or multiplies --
is noted in the recordings of its rank: the structure of the phase it falls
in is then not judged, never judged on an incomplete timeline.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from conformance.harness import rank_threads
from conformance.harness.probes.recording_mode import COLLECTIVE_NAMESPACES, MATMUL_OPS, NOT_COLLECTIVES, fused_name
from conformance.harness.probes.recordings import current, live

#: Threads inside an entry point already noted as another thread's (the process group's method under it is not).
noting: set[int] = set()


@functools.cache
def unseen_mode() -> type:
    """The watch of threads no recording reaches (a dispatch mode made once torch is imported)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class UnseenMode(TorchDispatchMode):
        """Notes, once, that a thread no recording reaches issued a collective or multiplied."""

        def __init__(self, what: str, rank: int | None) -> None:
            super().__init__()
            self.what, self.rank = what, rank

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            collective = func.namespace in COLLECTIVE_NAMESPACES and func._opname not in NOT_COLLECTIVES
            noted = threading.get_ident() in noting  # by the entry point that reached it
            if not noted and (collective or func._opname in MATMUL_OPS or fused_name(func._opname)):
                label = f"{func.namespace}.{func._opname} in {self.what}"
                for recording in list(live):
                    if recording.mine(self.rank):
                        recording.log.note_other_thread(label, collective=collective)
            return func(*args, **(kwargs or {}))

    return UnseenMode


def note_other_thread(what: str) -> None:
    """Note ``what`` (work no recording mode reached) in every live recording of this thread's rank, naming the
    thread: those phases' structure is then not judged."""
    rank = rank_threads.rank_of()
    label = f"{what} on thread {threading.current_thread().name!r}"
    for recording in list(live):
        if recording.mine(rank):
            recording.log.note_other_thread(label)


def watched_by_none() -> bool:
    """Whether this thread carries no recording while one of its rank is live (what it issues goes unrecorded)."""
    if not live or threading.get_ident() in noting:
        return False
    rank = rank_threads.rank_of()
    return current() is None and any(r.mine(rank) for r in list(live))


def start_watched(thread: threading.Thread, original_start: Any) -> None:
    """``Thread.start``: a thread started while a recording of its rank is live, carrying no mode, has what it
    issues or multiplies noted as unrecorded (the harness's own device thread carries the mode: not watched)."""
    rank = rank_threads.rank_of()
    if live and not getattr(thread, "_coc_carries_mode", False) and any(r.mine(rank) for r in list(live)):
        run = thread.run

        def watched_run() -> None:
            with rank_threads.working_for(rank):
                if current() is not None:
                    run()
                    return
                with unseen_mode()(f"helper thread {thread.name!r}", rank):
                    run()

        thread.run = watched_run  # type: ignore[method-assign]
    original_start(thread)


def unseen_if_unrecorded(what: str, original: Any) -> Any:
    """``original`` (an entry point), noted as another thread's when its thread carries no live recording."""

    @functools.wraps(original)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if not watched_by_none():
            return original(*args, **kwargs)
        note_other_thread(what)
        ident = threading.get_ident()
        noting.add(ident)
        try:
            return original(*args, **kwargs)
        finally:
            noting.discard(ident)

    return entry
