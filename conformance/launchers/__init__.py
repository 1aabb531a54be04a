"""Ways to start ranks: warm process pools, threads, or torchrun.

Every launcher satisfies :class:`Launcher`; checks never see which one runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from conformance.case import Case, RankOutcome

LAUNCHERS = ("process", "threaded", "torchrun")


class Launcher(Protocol):
    name: str

    def run(self, case: Case, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        """Run ``case`` on ``case.world_size`` ranks bound to ``devices``.

        Returns one outcome per rank; raises :class:`~conformance.errors.CaseTimeout`
        or :class:`~conformance.errors.RankCrashed` when ranks hang or die.
        """

    def close(self) -> None:
        """Release every rank this launcher holds."""
