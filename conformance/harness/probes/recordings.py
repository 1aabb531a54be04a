"""The recordings live in this process, and which one a thread carries (through the dispatch-mode stack)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conformance.harness.probes.collective_log import CollectiveLog

#: Guards the live recordings and the patches made once per process.
install_lock = threading.Lock()
#: Every recording live in this process, innermost last (under the threaded launcher, every rank's).
live: list[Recording] = []


@dataclass(eq=False)
class Recording:
    """One live :func:`record_collectives` block: its log, its delay, the rank it records for, per-thread scratch."""

    log: CollectiveLog
    delay: Callable[[], None] | None
    rank: int | None  #: the rank thread it records for (:func:`conformance.harness.rank_threads.rank_of`)
    #: Thread ident -> the torch.distributed entry points it is inside now (outermost first).
    api_stacks: dict[int, list[tuple[str, bool, Any]]] = field(default_factory=dict)

    def api_stack(self) -> list[tuple[str, bool, Any]]:
        return self.api_stacks.setdefault(threading.get_ident(), [])

    def mine(self, rank: int | None) -> bool:
        """Whether work of rank thread ``rank`` (None: of no known rank) may belong to this recording."""
        return rank is None or self.rank is None or self.rank == rank


def current() -> Recording | None:
    """The innermost recording whose mode this thread carries (None: none does).

    The dispatch-mode stack is C++ thread-local state, which the autograd
    engine carries to its device threads (Python's ``threading.local`` is not).
    """
    import torch

    c = torch._C
    for index in range(c._len_torch_dispatch_stack() - 1, -1, -1):
        recording = getattr(c._get_dispatch_stack_at(index), "_coc_recording", None)
        if recording is not None:
            return recording
    return None
