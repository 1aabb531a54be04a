"""Failures of a distributed case as seen by the test that ran it.

Each carries every rank's evidence (remote traceback, log, Python stacks) so the
report shows why a case failed without re-running it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from conformance.harness.case import RankOutcome


class CaseError(AssertionError):
    """Base class: a distributed case did not complete normally on every rank."""

    def __init__(self, message: str, *, stacks: Mapping[int, str] | None = None,
                 outcomes: Sequence[RankOutcome] = ()) -> None:
        super().__init__(message)
        self.stacks = dict(stacks or {})
        self.outcomes = list(outcomes)

    def evidence(self) -> str:
        """Every rank's stack (for hangs and crashes) or traceback and log."""
        parts = []
        for rank, stack in sorted(self.stacks.items()):
            parts.append(f"--- rank {rank} stack ---\n{stack}")
        for outcome in self.outcomes:
            if outcome.error is not None:
                parts.append(f"--- rank {outcome.rank} traceback ---\n{outcome.error.traceback}")
            if outcome.log:
                parts.append(f"--- rank {outcome.rank} log ---\n{outcome.log}")
        return "\n".join(parts)

    def __str__(self) -> str:
        evidence = self.evidence()
        return super().__str__() + (f"\n{evidence}" if evidence else "")


class CaseTimeout(CaseError):
    """The case did not finish on every rank within its budget (a hang)."""


class RankCrashed(CaseError):
    """A rank process died while starting or running the case."""


class RankRaised(CaseError):
    """At least one rank raised; see :attr:`outcomes` for each rank's error."""


class StormBroken(CaseError):
    """Not run: earlier cases of the same capability hung or crashed one after another."""


class WorkerLost(CaseError):
    """The pytest worker running the case died, or the run ended before the case ran."""


#: Failures filed under "hang / timeout" in the report.
HANGS: tuple[type[CaseError], ...] = (CaseTimeout, RankCrashed, StormBroken, WorkerLost)
