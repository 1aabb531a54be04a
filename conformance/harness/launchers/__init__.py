"""Ways to start ranks: warm process pools, threads, or torchrun.

Every launcher satisfies :class:`Launcher`; checks never see which one runs.
Launchers that start nothing ahead of a case (threads, and torchrun's ranks,
started by torchrun) inherit :class:`StartsNothingAhead`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from conformance.harness.case import RankOutcome, RankTask


class Launcher(Protocol):
    name: str
    #: Whether a task asking for ``fresh`` ranks runs on ranks that ran no case before (processes started anew).
    relaunches: bool

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        """Run ``task`` on ``task.world_size`` ranks bound to ``devices``.

        Returns one outcome per rank; raises :class:`~conformance.harness.case_errors.CaseTimeout`
        or :class:`~conformance.harness.case_errors.RankCrashed` when ranks hang or die.
        """

    def prestart(self) -> None:
        """Start what ranks are started from now (the fork server imports torch while pytest collects)."""

    def want_preloaded(self, names: Sequence[str], *, now: bool = False) -> None:
        """Have ranks start with ``names`` imported; ``now``: the list is complete (the session collected)."""

    def warm(self, world_sizes: Sequence[int]) -> None:
        """Start ranks of these world sizes ahead of the cases that need them, first needed first."""

    def close(self) -> None:
        """Release every rank this launcher holds."""


class StartsNothingAhead:
    """The part of :class:`Launcher` for launchers whose ranks start with the case (threads) or before the
    session (torchrun): there is nothing to start ahead."""

    def prestart(self) -> None:
        pass

    def want_preloaded(self, names: Sequence[str], *, now: bool = False) -> None:
        pass

    def warm(self, world_sizes: Sequence[int]) -> None:
        pass
