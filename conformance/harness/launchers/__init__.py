"""Ways to start ranks: warm process pools, threads, or torchrun.

Every launcher satisfies :class:`Launcher`; checks never see which one runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from conformance.harness.case import RankOutcome, RankTask


class Launcher(Protocol):
    name: str

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        """Run ``task`` on ``task.world_size`` ranks bound to ``devices``.

        Returns one outcome per rank; raises :class:`~conformance.harness.case_errors.CaseTimeout`
        or :class:`~conformance.harness.case_errors.RankCrashed` when ranks hang or die.
        """

    def close(self) -> None:
        """Release every rank this launcher holds."""
