"""The case clock's rules, with the ranks' CPU time scripted (docs/DESIGN.md#time-budget)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from conformance.harness.case_clock import CaseClock
from conformance.harness.progress import ProgressWatch, Rank


class ScriptedWatch(ProgressWatch):
    """CPU time as the test says: ranks in ``busy`` progress over every span."""

    def __init__(self, ranks: int, busy: Sequence[int] = ()) -> None:
        self.busy = set(busy)
        super().__init__({r: Rank(0) for r in range(ranks)})

    @property
    def available(self) -> bool:
        return True

    def mark(self, ranks: Sequence[int] | None = None) -> None:
        self._since = time.monotonic()

    def used(self, ranks: Sequence[int]) -> dict[int, float]:
        return {r: (1.0 if r in self.busy else 0.0) for r in ranks}


def verdict(clock: CaseClock, pending: Sequence[int]) -> str:
    """Wait for the clock's verdict on ``pending``."""
    while (why := clock.hung(pending)) is None:
        time.sleep(min(0.01, clock.left()))
    return why


def test_idle_ranks_are_hung_at_their_budget() -> None:
    clock = CaseClock(60, ScriptedWatch(2))
    clock.budget(0.05)
    assert "no collective completed and no rank used CPU time for the last" in verdict(clock, [1])


def test_busy_ranks_run_on_to_the_ceiling_which_says_they_kept_working() -> None:
    clock = CaseClock(0.3, ScriptedWatch(2, busy=[1]))
    clock.budget(0.05)
    why = verdict(clock, [1])
    assert why.startswith("rank(s) [1] did not finish within 0.3 s (the case's ceiling; its ranks kept progressing"), \
        why


def test_without_evidence_the_budget_is_wall_time() -> None:
    clock = CaseClock(60)
    clock.budget(0.05)
    why = verdict(clock, [0])
    assert "(the case's budget; no collective completed on them for its last" in why and "ceiling 60 s)" in why, why


def completing(clock: CaseClock, rank: int, every_s: float = 0.01) -> str:
    """The clock's verdict on ``rank``, which sees a collective complete every ``every_s`` (using no CPU)."""
    while (why := clock.hung([rank])) is None:
        clock.collective_completed(rank)
        time.sleep(every_s)
    return why


def test_collectives_completing_are_progress_without_cpu_time() -> None:
    clock = CaseClock(0.3, ScriptedWatch(2))
    clock.budget(0.05)
    why = completing(clock, 1)
    assert why.startswith("rank(s) [1] did not finish within 0.3 s (the case's ceiling; its ranks kept progressing"), \
        why


def test_collectives_completing_are_progress_where_cpu_time_is_not_measured() -> None:
    clock = CaseClock(0.3)
    clock.budget(0.05)
    assert "(the case's ceiling; its ranks kept progressing" in completing(clock, 0)


def test_another_ranks_collectives_are_no_progress_of_a_hung_rank() -> None:
    clock = CaseClock(60, ScriptedWatch(2))
    clock.budget(0.05)
    clock.collective_completed(0)  # rank 0 finished; rank 1 is the one still running
    assert "no collective completed and no rank used CPU time" in verdict(clock, [1])


def test_the_budget_waits_for_every_rank_to_load_the_implementation() -> None:
    clock = CaseClock(60, ScriptedWatch(2), loading=[0, 1])
    clock.budget(0.01, rank=0)
    time.sleep(0.05)
    assert clock.hung([0, 1]) is None, "the budget ran while rank 1 was loading"
    clock.loaded(0)
    clock.loaded(1)
    assert clock.left() > 0.0
    assert "of the case's budget" in verdict(clock, [0, 1])


def test_a_load_that_outlasts_the_ceiling_is_named_as_a_load() -> None:
    clock = CaseClock(0.05, ScriptedWatch(2), loading=[0, 1])
    clock.loaded(0)
    why = verdict(clock, [0, 1])
    assert why.startswith("rank(s) [1] were still loading the implementation after 0.05 s"), why
