"""Completion counting: collectives seen completing (the case clock's second evidence of progress), and the fused
kernels' calls seen inside recordings."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from conformance.harness import rank_threads


@dataclass
class CompletionCount:
    """Collectives this process saw complete, in all and per rank thread; counted always once
    :func:`count_completions` ran.

    A rank reports its count in its progress evidence
    (:mod:`conformance.harness.progress`), so that
    :class:`~conformance.harness.case_clock.CaseClock` does not take a rank
    blocked in a slow collective that completes (it uses no CPU) for a hung
    one.  Each wait that returns counts (a blocking call waits too), on
    whichever thread: a completion counts for the rank thread the waiting
    thread works for (:func:`conformance.harness.rank_threads.rank_of`: its
    device thread's count for it).  Inside a recording a completion the
    timeline sees otherwise (a functional wait, a poll answering True) counts as
    well, so one completion may count twice: the count is evidence that
    something completed, not how many did.
    """

    count: int = 0
    by_rank: dict[int, int] = field(default_factory=dict)

    def note(self) -> None:
        self.count += 1
        rank = rank_threads.rank_of()
        key = threading.get_ident() if rank is None else rank
        self.by_rank[key] = self.by_rank.get(key, 0) + 1

    def of_rank(self, rank_thread: int) -> int:
        """Completions counted for rank thread ``rank_thread`` (on it, or on a thread working for it)."""
        return self.by_rank.get(rank_thread, 0)


COMPLETED = CompletionCount()


class FusedCalls:
    """Calls of torch_npu's fused kernels (:data:`FUSED_KERNELS`) inside recordings, per rank thread and kernel.

    :func:`~conformance.harness.case.run_on_rank` reads what its task added
    into the rank's outcome: the JSON summary then says, per case, which fused
    kernels the implementation's calls reached (MC² on an NPU, or none).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_rank: dict[int | None, Counter[str]] = {}

    def note(self, kernel: str, rank: int | None) -> None:
        with self._lock:
            self._by_rank.setdefault(rank, Counter())[kernel] += 1

    def of_rank(self, rank: int | None) -> Counter[str]:
        """The calls counted for rank thread ``rank`` so far (a copy)."""
        with self._lock:
            return Counter(self._by_rank.get(rank, ()))

    def since(self, before: Counter[str], rank: int | None) -> dict[str, int]:
        """The calls counted for ``rank`` since :meth:`of_rank` gave ``before``, by kernel."""
        return {kernel: n for kernel, n in sorted((self.of_rank(rank) - before).items())}


FUSED_CALLS = FusedCalls()
