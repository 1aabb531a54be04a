"""When a running case is declared hung: its budget, moved on while every rank progresses, under its ceiling.

``docs/DESIGN.md#time-budget`` and ``#progress-evidence``.  The ceiling
(``--coc-case-timeout``) is wall time and final.  The budget a task declares
(:meth:`RankContext.expect_within
<conformance.harness.case.RankContext.expect_within>`) starts once every rank
has loaded the implementation (a framework's import is not the first case's
fault).  When it runs out, each running rank is judged on its own evidence
(:mod:`conformance.harness.progress`): it *progressed* (its task thread used
CPU time, saw a collective complete, changed its stack, or its device
completed work), it is *waiting* in a collective (for the others), or it is
*stalled* (neither, over enough samples of its stack; a rank sampled too
seldom on a loaded machine is not judged).  The case gets the same span
again only if some rank progressed (or was not judged) and none stalled: a
rank's work is no evidence for another rank, so a stalled rank beside busy or
spinning ones is a hang at the budget.
Without any evidence (no ``/proc`` and no reports) the budget is wall time.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from conformance.harness.cpu_time import ProgressWatch
from conformance.harness.progress import Evidence

#: The shortest window of evidence: a test's budget of 0.5 s holds too few stack samples on a loaded machine.
MIN_WINDOW_S = 2.0
#: How long before the window a verdict reads opens a rank's evidence is sampled (the mark that opens it must find
#: that evidence fresh, and the window must hold samples from its start).
SAMPLING_LEAD_S = 1.0


def sampling_starts(span: float) -> float:
    """Seconds into a budget of ``span`` from which a rank's evidence must be sampled.

    The first verdict, at the budget's end, reads the growth over the window
    from the mark half a budget in (from the budget's start where half a
    budget is shorter than :data:`MIN_WINDOW_S`), and later ones over windows
    later still; no verdict reads what a rank showed before.  A case that ends
    within half its budget, as all but slow ones do, is never sampled."""
    opens = span / 2 if span / 2 >= MIN_WINDOW_S else 0.0
    return max(0.0, opens - SAMPLING_LEAD_S)


@dataclass(frozen=True)
class _Mark:
    """The ranks' evidence at one moment: what a later verdict measures growth from."""

    at: float
    evidence: dict[int, Evidence]
    cpu: tuple[float, dict[int, float | None]] | None


class CaseClock:
    """The deadline of one case's run and, once it has passed, why the case is hung.

    Evidence is judged over the last half budget (:data:`MIN_WINDOW_S` at
    least): marks are taken every half budget, and once the budget is spent
    the case is judged at every mark on the growth over that window.  A rank that stalls early in the budget
    (after setting up a call) is declared at the budget; one that stalls later,
    within a budget of stalling.
    """

    def __init__(self, ceiling_s: float, watch: ProgressWatch | None = None,
                 loading: Iterable[int] = (), *, min_window_s: float = MIN_WINDOW_S) -> None:
        self.ceiling_s = ceiling_s
        self.min_window_s = min_window_s
        self.started = time.monotonic()
        self.ceiling = self.started + ceiling_s
        self.deadline = self.ceiling
        self.watch = watch if watch is not None and watch.available else None
        #: Ranks still loading the implementation (the budget waits for them).
        self.loading = set(loading)
        self._span: float | None = None  #: the budget's length, once declared
        self._extended = False  #: whether progress has moved the deadline on
        self._latest: dict[int, Evidence] = {}  #: each rank's latest reported evidence
        self._marks: list[_Mark] = []  #: evidence every half budget, the last budgets of it
        self._next_mark: float | None = None  #: when the next mark is due (before the deadline)
        self._sample_from = float("inf")  #: when evidence starts to matter (:func:`sampling_starts`)

    def left(self) -> float:
        """Seconds until the current deadline, or the next mark before it."""
        due = self.deadline if self._next_mark is None else min(self.deadline, self._next_mark)
        return max(0.0, due - time.monotonic())

    def budget(self, seconds: float, rank: int | None = None) -> None:
        """A rank's task declared that the rest of it finishes within ``seconds`` (never past an earlier budget).

        The window of evidence starts now.
        """
        self._span = seconds
        if not self.loading:
            self._start_budget(seconds, keep_later=True)

    def loaded(self, rank: int) -> None:
        """``rank`` has loaded the implementation; once all have, a declared budget counts from now."""
        self.loading.discard(rank)
        if not self.loading and self._span is not None and self.deadline >= self.ceiling:
            self._start_budget(self._span, keep_later=False)

    def wants_evidence(self) -> bool:
        """Whether a verdict may read the ranks' evidence sampled now (:func:`sampling_starts`)."""
        return time.monotonic() >= self._sample_from

    def report(self, rank: int, evidence: Evidence) -> None:
        """``rank``'s evidence of progress since its task began (its counters only grow)."""
        self._latest[rank] = evidence

    def _start_budget(self, seconds: float, *, keep_later: bool) -> None:
        now = time.monotonic()
        earlier = self.deadline if keep_later and self.deadline < self.ceiling else 0.0
        self.deadline = min(self.ceiling, max(earlier, now + seconds))
        self._sample_from = min(self._sample_from, now + sampling_starts(seconds))
        self._marks = []
        self._mark(now)

    def _mark(self, now: float) -> None:
        """Note every rank's evidence now; the next mark is due half a budget later."""
        self._marks.append(_Mark(now, dict(self._latest), self.watch.readings() if self.watch is not None else None))
        span = self._span or 0.0
        self._marks = [m for m in self._marks if now - m.at <= 2 * max(span, self.min_window_s)] or self._marks[-1:]
        self._next_mark = now + span / 2

    def _window(self, now: float) -> _Mark:
        """The mark half a budget (at least :data:`MIN_WINDOW_S`) before ``now``; the oldest there is, early on."""
        window = max(0.45 * (self._span or 0.0), self.min_window_s)
        old = [m for m in self._marks if now - m.at >= window]
        return old[-1] if old else self._marks[0]

    def progressed(self, ranks: Collection[int], since: _Mark) -> dict[int, list[str]]:
        """What each of ``ranks`` showed of its own progress since ``since`` (absent: nothing)."""
        busy = (set(self.watch.progressed(list(ranks), since.cpu, self._helper_cpu(ranks, since)))
                if self.watch is not None else set())
        shown = {}
        for rank in ranks:
            what = self._latest.get(rank, Evidence()).grew(since.evidence.get(rank, Evidence()))
            if rank in busy:
                what.append("cpu_time")
            if what:
                shown[rank] = what
        return shown

    def _helper_cpu(self, ranks: Collection[int], since: _Mark) -> dict[int, float]:
        """CPU seconds each rank's helper threads (its emulated device thread) used since ``since``."""
        return {r: max(0.0, self._latest.get(r, Evidence()).helper_cpu_s
                       - since.evidence.get(r, Evidence()).helper_cpu_s) for r in ranks}

    def hung(self, pending: Collection[int]) -> str | None:
        """None while ``pending`` ranks have time left, or progressed (the deadline moves on); else why they hung."""
        now = time.monotonic()
        if not pending:
            return None
        if now < self.deadline:
            if self._next_mark is not None and now >= self._next_mark:
                self._mark(now)
            return None
        ranks = sorted(pending)
        elapsed = now - self.started
        if self.deadline >= self.ceiling:
            return self._past_ceiling(ranks)
        since = self._window(now)
        span = now - since.at
        progressed = self.progressed(ranks, since)
        waiting = [r for r in ranks if r not in progressed and self._latest.get(r, Evidence()).waiting]
        unseen = [r for r in ranks if r not in progressed and r not in waiting and r in self._latest
                  and not self._latest[r].seen(since.evidence.get(r, Evidence()))]
        stalled = [r for r in ranks if r not in progressed and r not in waiting and r not in unseen]
        if (progressed or unseen) and not stalled:
            self._extended = True
            self.deadline = min(self.ceiling, now + (self._span or span) / 2)
            self._mark(now)
            return None
        if self.watch is None and not self._latest:
            return (f"rank(s) {ranks} did not finish within {elapsed:.3g} s (the case's budget; no collective "
                    f"completed on them for its last {span:.3g} s; ceiling {self.ceiling_s:g} s)")
        what = "no collective completed, no stack changed"
        if self.watch is not None:
            most = max(self.watch.used(stalled if progressed else ranks, since.cpu,
                                       self._helper_cpu(ranks, since)).values(), default=0.0)
            what += (f" and no rank used CPU time for the last {span:.3g} s of the case's budget (at most "
                     f"{most * 1e3:.0f} ms each, what a rank blocked in a collective uses")
        else:
            what += f" and no device work completed for the last {span:.3g} s of the case's budget ("
            what += "CPU time is no evidence on a device"
        waits = f"; rank(s) {waiting} waiting in a collective" if waiting else ""
        if waiting and stalled and not progressed:
            waits += f", rank(s) {stalled} stalled outside any"
        if progressed:
            busy = ", ".join(f"{r}: {'+'.join(w)}" for r, w in sorted(progressed.items()))
            return (f"rank(s) {stalled} stalled: did not finish within {elapsed:.3g} s, and on them {what}"
                    f"{waits}), while rank(s) {sorted(progressed)} kept busy ({busy}): one rank's work is no "
                    f"evidence for another's (ceiling {self.ceiling_s:g} s)")
        return f"rank(s) {ranks} did not finish within {elapsed:.3g} s: {what}{waits}; ceiling {self.ceiling_s:g} s)"

    def _past_ceiling(self, ranks: list[int]) -> str:
        loading = sorted(self.loading.intersection(ranks))
        if loading:
            return (f"rank(s) {loading} were still loading the implementation after {self.ceiling_s:g} s "
                    "(the case's ceiling; loading is bounded by the ceiling only, not by the budget)")
        why = f"rank(s) {ranks} did not finish within {self.ceiling_s:g} s (the case's ceiling"
        if self._extended:
            why += ("; its ranks kept progressing (each using CPU time, completing collectives, changing its stack "
                    "or completing device work, or waiting in a collective for one that did) past their budget")
        return why + ")"
