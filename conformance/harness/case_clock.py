"""When a running case is declared hung: its budget, moved on while its ranks progress, under its ceiling.

``docs/DESIGN.md#time-budget``.  The ceiling (``--coc-case-timeout``) is wall
time and final.  The budget a task declares (:meth:`RankContext.expect_within
<conformance.harness.case.RankContext.expect_within>`) starts once every rank
has loaded the implementation (a framework's import is not the first case's
fault), and when it runs out the case is hung only if none of its running
ranks progressed over the budget -- used CPU time
(:mod:`conformance.harness.progress`), or saw a collective complete (the
count :mod:`conformance.harness.probes` keeps, which a rank reports in its
progress messages: a rank blocked in a slow collective that completes uses
no CPU) -- otherwise it is given the same span again, up to the ceiling.
Without either evidence (no ``/proc``, or a device backend whose waits spin
on the CPU, and no collective completing) the budget is wall time.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable

from conformance.harness.progress import ProgressWatch


class CaseClock:
    """The deadline of one case's run and, once it has passed, why the case is hung."""

    def __init__(self, ceiling_s: float, watch: ProgressWatch | None = None,
                 loading: Iterable[int] = ()) -> None:
        self.ceiling_s = ceiling_s
        self.started = time.monotonic()
        self.ceiling = self.started + ceiling_s
        self.deadline = self.ceiling
        self.watch = watch if watch is not None and watch.available else None
        #: Ranks still loading the implementation (the budget waits for them).
        self.loading = set(loading)
        self._span: float | None = None  #: the budget's length, once declared
        self._extended = False  #: whether progress has moved the deadline on
        self._since = self.started  #: when the current span of evidence began
        self._completing: set[int] = set()  #: ranks that saw a collective complete in the current span

    def left(self) -> float:
        """Seconds until the current deadline."""
        return max(0.0, self.deadline - time.monotonic())

    def budget(self, seconds: float, rank: int | None = None) -> None:
        """``rank``'s task declared that the rest of it finishes within ``seconds`` (never past an earlier budget).

        Its span of CPU time starts now (every rank's, when None).
        """
        self._span = seconds
        if not self.loading:
            self._start_budget(seconds, keep_later=True, ranks=None if rank is None else [rank])

    def loaded(self, rank: int) -> None:
        """``rank`` has loaded the implementation; once all have, a declared budget counts from now."""
        self.loading.discard(rank)
        if not self.loading and self._span is not None and self.deadline >= self.ceiling:
            self._start_budget(self._span, keep_later=False)

    def collective_completed(self, rank: int) -> None:
        """``rank`` saw a collective complete: it progressed in the current span."""
        self._completing.add(rank)

    def _start_budget(self, seconds: float, *, keep_later: bool, ranks: list[int] | None = None) -> None:
        now = time.monotonic()
        earlier = self.deadline if keep_later and self.deadline < self.ceiling else 0.0
        self.deadline = min(self.ceiling, max(earlier, now + seconds))
        self._mark(ranks)

    def _mark(self, ranks: list[int] | None = None) -> None:
        """A new span of evidence starts now (for ``ranks``; every rank when None)."""
        self._since = time.monotonic()
        self._completing.difference_update(self._completing if ranks is None else ranks)
        if self.watch is not None:
            self.watch.mark(ranks)

    def hung(self, pending: Collection[int]) -> str | None:
        """None while ``pending`` ranks have time left, or progressed (the deadline moves on); else why they hung."""
        now = time.monotonic()
        if now < self.deadline or not pending:
            return None
        ranks = sorted(pending)
        elapsed = now - self.started
        if self.deadline >= self.ceiling:
            return self._past_ceiling(ranks)
        span = now - self._since
        if self._completing.intersection(ranks) or (self.watch is not None and self.watch.progressed(ranks)):
            self._extended = True
            self.deadline = min(self.ceiling, now + (self._span or span))
            self._mark()
            return None
        if self.watch is None:
            return (f"rank(s) {ranks} did not finish within {elapsed:.3g} s (the case's budget; no collective "
                    f"completed on them for its last {span:.3g} s; ceiling {self.ceiling_s:g} s)")
        most = max(self.watch.used(ranks).values(), default=0.0)
        return (f"rank(s) {ranks} did not finish within {elapsed:.3g} s: no collective completed and no rank used "
                f"CPU time for the last {span:.3g} s of the case's budget (at most {most * 1e3:.0f} ms each, what "
                f"a rank blocked in a collective uses; ceiling {self.ceiling_s:g} s)")

    def _past_ceiling(self, ranks: list[int]) -> str:
        loading = sorted(self.loading.intersection(ranks))
        if loading:
            return (f"rank(s) {loading} were still loading the implementation after {self.ceiling_s:g} s "
                    "(the case's ceiling; loading is bounded by the ceiling only, not by the budget)")
        why = f"rank(s) {ranks} did not finish within {self.ceiling_s:g} s (the case's ceiling"
        if self._extended:
            why += "; its ranks kept progressing (using CPU time or completing collectives) past their budget"
        return why + ")"
