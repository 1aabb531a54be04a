"""The probes see every collective however it was reached, its wait, its group, and what each matmul multiplies."""

from __future__ import annotations

from conformance.harness.case import RankTask
from conformance.harness.launchers.process_launcher import ProcessLauncher
from tests.support import rank_cases

IMPL = "coc_impl.reference:ReferenceCoC"


def test_collectives_through_an_alias_bound_before_the_probes_are_seen_launched_and_waited(
        pool: ProcessLauncher) -> None:
    for outcome in pool.run(RankTask(rank_cases.through_an_alias, 2), (), IMPL):
        seen = outcome.value
        assert seen["calls"] == [
            ("all_reduce", True, False, "live"),  # waited through the handle the alias returned
            ("all_gather", False, False, "live"),
            ("all_reduce", False, False, "gone"),  # destroyed after a recording saw it alive
            ("all_reduce", False, False, "unknown"),  # destroyed before any recording saw it
            ("all_reduce", True, True, "live"),  # still in flight when the recording ended
        ]
        assert seen["overlapped"] == [[((4, 4), ["w"])]]  # the matmul before the wait, known by its operand
        assert seen["gone_ranks"] == (0, 1)
        assert seen["completed"] == 4
