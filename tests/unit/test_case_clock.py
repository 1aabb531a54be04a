"""The case clock's rules, with the ranks' CPU time and evidence scripted (DESIGN.md#time-budget)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from conformance.harness.case_clock import CaseClock
from conformance.harness.cpu_time import ProgressWatch, Rank
from conformance.harness.progress import Evidence


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

    def used(self, ranks: Sequence[int], since: object = None,
             helpers: Mapping[int, float] | None = None) -> dict[int, float]:
        return {r: (1.0 if r in self.busy else 0.0) + (helpers or {}).get(r, 0.0) for r in ranks}


def verdict(clock: CaseClock, pending: Sequence[int]) -> str:
    """Wait for the clock's verdict on ``pending``."""
    while (why := clock.hung(pending)) is None:
        time.sleep(min(0.01, clock.left()))
    return why


def test_idle_ranks_are_hung_at_their_budget() -> None:
    clock = CaseClock(60, ScriptedWatch(2))
    clock.budget(0.05)
    assert "no collective completed, no stack changed and no rank used CPU time for the last" in verdict(clock, [1])


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


def reporting(clock: CaseClock, pending: Sequence[int], grows: str = "completed", every_s: float = 0.01,
              waiting: Sequence[int] = ()) -> str:
    """The clock's verdict on ``pending``; each reports its ``grows`` counter growing every ``every_s`` (no CPU).

    Ranks in ``waiting`` report nothing growing, and that they wait in a collective.
    """
    count = 0
    while (why := clock.hung(pending)) is None:
        count += 1
        for rank in pending:
            if rank in waiting:
                clock.report(rank, Evidence(samples=count, waiting=True))
            else:
                clock.report(rank, Evidence(**{grows: count, "samples": count}))
        time.sleep(every_s)
    return why


def scripted(clock: CaseClock, pending: Sequence[int], evidence: Callable[[int], dict[int, Evidence]],
             every_s: float = 0.01) -> str:
    """The clock's verdict on ``pending``; at the n-th look the ranks report ``evidence(n)``."""
    count = 0
    while (why := clock.hung(pending)) is None:
        count += 1
        for rank, shown in evidence(count).items():
            clock.report(rank, shown)
        time.sleep(min(every_s, clock.left()))
    return why


def completing(clock: CaseClock, rank: int) -> str:
    """The clock's verdict on ``rank``, which sees a collective complete every 10 ms (using no CPU)."""
    return reporting(clock, [rank])


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


def test_cpu_time_of_a_ranks_device_thread_is_its_progress() -> None:
    """A rank whose task thread waits for its backward (the emulated device thread) uses CPU time on that thread."""
    clock = CaseClock(0.3, ScriptedWatch(2))
    clock.budget(0.05)
    why = scripted(clock, [1], lambda n: {1: Evidence(samples=n, helper_cpu_s=0.01 * n)})
    assert why.startswith("rank(s) [1] did not finish within 0.3 s (the case's ceiling; its ranks kept progressing"), \
        why


def test_a_device_thread_idle_as_a_blocked_collective_is_no_progress() -> None:
    clock = CaseClock(60, ScriptedWatch(2))
    clock.budget(0.05)
    why = scripted(clock, [1], lambda n: {1: Evidence(samples=n, helper_cpu_s=1e-5 * n)})
    assert "no collective completed, no stack changed and no rank used CPU time" in why, why


def test_another_ranks_collectives_are_no_progress_of_a_hung_rank() -> None:
    clock = CaseClock(60, ScriptedWatch(2))
    clock.budget(0.05)
    clock.report(0, Evidence(completed=1))  # rank 0 finished; rank 1 is the one still running
    assert "no collective completed, no stack changed and no rank used CPU time" in verdict(clock, [1])


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


def test_a_stalled_rank_beside_a_busy_one_is_hung_at_the_budget() -> None:
    """Rank 1 uses CPU time (a spin); rank 0 shows nothing and is not in a collective: hung, not run on."""
    clock = CaseClock(60, ScriptedWatch(2, busy=[1]))
    clock.budget(0.05)
    why = verdict(clock, [0, 1])
    assert why.startswith("rank(s) [0] stalled: did not finish within"), why
    assert "while rank(s) [1] kept busy (1: cpu_time)" in why and "of the case's budget" in why, why


def test_a_rank_waiting_in_a_collective_for_a_busy_one_runs_on() -> None:
    """Rank 0 computes (CPU time), rank 1 waits for it in a collective: slow, not hung."""
    clock = CaseClock(0.3, ScriptedWatch(2, busy=[0]))
    clock.budget(0.05)
    why = reporting(clock, [0, 1], waiting=[1])
    assert why.startswith("rank(s) [0, 1] did not finish within 0.3 s (the case's ceiling; its ranks kept"), why


def test_ranks_all_waiting_in_collectives_are_hung() -> None:
    clock = CaseClock(60, ScriptedWatch(2))
    clock.budget(0.05)
    why = reporting(clock, [0, 1], waiting=[0, 1])
    assert "no rank used CPU time for the last" in why and "rank(s) [0, 1] waiting in a collective" in why, why


def test_stack_changes_and_device_work_are_progress_where_cpu_time_is_not_evidence() -> None:
    """A device rank compiling (its stack changes) or waiting for its device (events complete) runs on."""
    for grows in ("stack_changes", "device_done"):
        clock = CaseClock(0.3)
        clock.budget(0.2)
        assert "(the case's ceiling; its ranks kept progressing" in reporting(clock, [0], grows), grows


def test_a_stalled_device_rank_beside_one_whose_stack_changes_is_hung() -> None:
    clock = CaseClock(60)
    clock.budget(0.2)
    why = scripted(clock, [0, 1], lambda n: {0: Evidence(samples=n), 1: Evidence(stack_changes=n, samples=n)})
    assert why.startswith("rank(s) [0] stalled"), why
    assert "no device work completed" in why and "(1: stack_changes)" in why, why


def test_a_rank_sampled_too_seldom_to_judge_is_not_called_stalled() -> None:
    """On a loaded machine a rank's sampler may miss a span: no verdict on it from that span."""
    clock = CaseClock(0.3)
    clock.budget(0.05)
    why = scripted(clock, [0, 1], lambda n: {0: Evidence(samples=1), 1: Evidence(stack_changes=n, samples=n)})
    assert "(the case's ceiling; its ranks kept progressing" in why, why


def test_a_stack_seen_changing_at_few_of_many_samples_is_no_progress() -> None:
    """A loop that sleeps and checks is caught on its other line now and then: not work."""
    clock = CaseClock(60)
    clock.budget(0.05)
    why = scripted(clock, [0], lambda n: {0: Evidence(stack_changes=n // 20, samples=n)}, every_s=0.002)
    assert "no collective completed, no stack changed" in why, why


def test_a_rank_that_set_up_and_then_stalled_is_hung_at_the_budget() -> None:
    """Rank 0 worked early in the budget (set up the call), then stopped: judged on the last half budget, hung."""
    clock = CaseClock(60, ScriptedWatch(2, busy=[1]), min_window_s=0.0)
    clock.budget(0.2)
    first = clock.deadline
    clock.report(0, Evidence(stack_changes=5, samples=5))
    why = scripted(clock, [0, 1], lambda n: {0: Evidence(stack_changes=5, samples=5 + n)})
    assert why.startswith("rank(s) [0] stalled"), why
    assert clock.deadline == first, "the case was given more time"


def test_after_the_budget_the_case_is_judged_every_half_budget() -> None:
    clock = CaseClock(60, ScriptedWatch(2, busy=[0, 1]), min_window_s=0.0)
    clock.budget(0.2)
    first = clock.deadline
    while clock.hung([0, 1]) is None and clock.deadline == first:
        time.sleep(min(0.01, clock.left()))
    assert 0.05 < clock.deadline - first <= 0.15, "the next verdict is due half a budget after the first"


def test_evidence_is_wanted_from_where_the_first_verdicts_window_can_open() -> None:
    from conformance.harness.case_clock import sampling_starts

    clock = CaseClock(60)
    assert not clock.wants_evidence()  # no budget: the ceiling reads no evidence
    clock.budget(10.0)
    assert not clock.wants_evidence() and sampling_starts(10.0) > 0
    clock.budget(0.5)
    assert clock.wants_evidence()
