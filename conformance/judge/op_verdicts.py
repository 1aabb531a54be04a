"""The judging sequence of one op run: the suite's checks, each at its level, in the order the suite states them.

The fixed suite (``conformance/suite/test_ops.py``) and the explorer
(``conformance/explore/``) both judge an :class:`~conformance.contract.jobs.OpRun`
with this one function, so a rule exists once and a case the explorer finds
fails the same named check as a suite test would.
"""

from __future__ import annotations

from collections.abc import Sequence

from conformance.contract.jobs import OpRun
from conformance.contract.results import OpRunOutcome
from conformance.judge import ops as judge
from conformance.judge.levels import Level
from conformance.judge.verdicts import NotJudged, Verdicts


def judge_op_runs(verdicts: Verdicts, judged: Sequence[tuple[OpRun, Sequence[OpRunOutcome]]],
                  in_place_ops: frozenset[str] = frozenset(), *, exact: bool = False) -> None:
    """Record every check of each ``(run, its outcomes on every rank)`` into ``verdicts`` (failures recorded, none
    raised); a call sequence's runs are judged together, one verdict per check."""
    with verdicts.check("the op ran on every rank", Level.MUST):
        for run, outcomes in judged:
            judge.check_ran(run, outcomes)
    with verdicts.check("results are values", Level.MUST):
        for run, outcomes in judged:
            _needs_every_result(outcomes)
            judge.check_contract(run, outcomes, in_place_ops)
    with verdicts.check("numerics" if not exact else "exact layout", Level.MUST):
        for run, outcomes in judged:
            _needs_every_result(outcomes)
            judge.check_numerics(run, outcomes, exact=exact)
    with verdicts.check("replicated results bitwise identical", Level.SHOULD):
        for run, outcomes in judged:
            _needs_every_result(outcomes)
            judge.check_identical_copies(run, outcomes)


def _needs_every_result(outcomes: Sequence[OpRunOutcome]) -> None:
    """Not judged where a call raised on some rank: "the op ran on every rank" has failed, no result to judge."""
    if any(e is not None for e in judge.call_errors(outcomes)):
        raise NotJudged("a call raised on some rank (the op ran on every rank failed): its results are missing")
