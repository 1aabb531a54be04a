"""A hang is a lack of progress, not elapsed time (docs/DESIGN.md#time-budget, #progress-evidence).

Correct cases slowed by CPU contention, or by a long first call, keep running
past their budget; a real deadlock (ranks idle in a collective), and a rank
stalled beside spinning ones, are declared at their budget; loading the
implementation is not charged to the first case.  No absolute timing is
asserted: each verdict is one the clock could only reach by the rule tested.
"""

from __future__ import annotations

import os

import pytest

from conformance.bench.hangs import cpu_hogs, side_by_side
from conformance.harness.case import Budget, RankTask
from conformance.harness.case_errors import CaseTimeout
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.harness.launchers.threaded import ThreadedLauncher
from conformance.options import DEFAULT_IMPL
from tests.support import rank_cases

#: A budget the busy case's CPU work alone outlasts, on any machine.
TIGHT = Budget(factor=20, floor=0.5)
BUSY_CPU_S = 1.0


def test_a_slowed_correct_case_passes_and_a_deadlock_is_declared_at_its_budget(
    launcher: ProcessLauncher | ThreadedLauncher,
) -> None:
    """Side by side under the same CPU hogs and the same tight budget (ceiling 120 s).

    The long first call warms for six budgets with almost no CPU time: only its stack changing keeps it running.
    The stalled rank's verdict names the budget, which the clock gives only before the ceiling.
    """
    with cpu_hogs(os.cpu_count() or 2):
        run = side_by_side(launcher, TIGHT, BUSY_CPU_S, impl_spec=DEFAULT_IMPL, first_call_s=6 * TIGHT.floor)
    print(f"{launcher.name}: budget {run.budget_s:g} s, correct case {run.busy_s:.1f} s, "
          f"deadlock declared after {run.deadlock_s:.1f} s, long first call {run.first_call_s:.1f} s, "
          f"stalled rank declared after {run.stalled_s:.1f} s")
    assert isinstance(run.busy, list) and all(o.ok and o.value >= 1 for o in run.busy), run.busy
    assert isinstance(run.deadlock, CaseTimeout), run.deadlock
    message = str(run.deadlock).splitlines()[0]
    assert "no rank used CPU time for the last" in message and "of the case's budget" in message, message
    assert "rank(s) [1]" in message, message
    assert isinstance(run.first_call, list) and all(o.ok and o.value > 1 for o in run.first_call), run.first_call
    assert isinstance(run.stalled, CaseTimeout), run.stalled
    message = str(run.stalled).splitlines()[0]
    assert "rank(s) [0] stalled" in message and "of the case's budget" in message, message


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "unrecorded"])
def test_ranks_waiting_in_slow_collectives_that_complete_are_not_hung(pool: ProcessLauncher, recorded: bool) -> None:
    """No rank uses CPU time (rank 0 sleeps, the others wait for it), but each all-reduce completes: it runs on.

    Completions are counted whether or not the case records its collectives.
    """
    # A budget of a third of the run (8 pauses of 0.3 s): a pause that a loaded machine stretches past the budget
    # (0.5 s once failed at load 10) is no stall, yet without the completions as evidence the case is declared hung.
    task = RankTask(rank_cases.slow_collectives, 2, {"rounds": 8, "pause_s": 0.3, "recorded": recorded},
                    timeout=120, budget=Budget(factor=1, floor=0.8))
    outcomes = pool.run(task, (), DEFAULT_IMPL)
    assert [o.value for o in outcomes] == [8, 8], [o.error for o in outcomes]


def test_the_budget_starts_once_the_implementation_is_loaded(pool: ProcessLauncher) -> None:
    """Loading takes several budget floors; the case's budget is the floor, and it passes."""
    spec = "tests.support.harness_faults:SlowToLoad"
    outcomes = pool.run(RankTask(rank_cases.impl_name, 2, timeout=120, budget=TIGHT), (), spec)
    assert [o.value for o in outcomes] == ["slow-to-load"] * 2, [o.error for o in outcomes]


def test_a_load_that_never_ends_is_declared_at_the_ceiling_as_a_load(pool: ProcessLauncher) -> None:
    spec = "tests.support.harness_faults:HangsWhileLoading"
    with pytest.raises(CaseTimeout) as info:
        pool.run(RankTask(rank_cases.impl_name, 2, timeout=3, budget=TIGHT), (), spec)
    message = str(info.value).splitlines()[0]
    assert "rank(s) [0, 1] were still loading the implementation after 3 s (the case's ceiling" in message, message
    assert all("harness_faults.py" in info.value.stacks[r] for r in (0, 1)), info.value.stacks
    assert pool.run(RankTask(rank_cases.whoami, 2), (), DEFAULT_IMPL)[0].value == (0, 2, "process")
