"""The judging sequence of one op run: the suite's checks, each at its level, in the order the suite states them.

The fixed suite (``conformance/suite/test_ops.py``) and the explorer
(``conformance/explore/``) both judge an :class:`~conformance.contract.jobs.OpRun`
with this one function, so a rule exists once and a case the explorer finds
fails the same named check as a suite test would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OpRun
from conformance.contract.results import OpRunOutcome
from conformance.judge import checks
from conformance.judge import ops as judge
from conformance.judge.failures import DeterminismViolation
from conformance.judge.levels import Level
from conformance.judge.verdicts import NotJudged, Verdicts
from conformance.protocol import Declarations

#: What a refusal of strided operands may name.
STRIDE_NAMES = [r"contiguous", r"strides?", r"layout", r"view", r"offset", r"\bw\b|weight", r"\bx\b"]


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


def refusal_names(m: int, tp: int) -> list[str]:
    """What a refusal of ``m`` rows may name: the token count, tp, rows, the setting."""
    return [rf"\b{m}\b", rf"\b{m // tp}\b" if m >= tp else rf"\b{m}\b", r"\bm\b", r"\btp\b", r"\brows?\b",
            r"tokens?", r"chunk", r"tile|tiling|block"]


def issued(outcomes: Sequence[OpRunOutcome], call: int = 0) -> list[list[str]]:
    """Per rank, the collectives its ``call`` issued (before it raised, when it did)."""
    return [[c.kind for t in o.calls[call].timelines for c in t.collectives] if call < len(o.calls) else []
            for o in outcomes]


def judge_refusal(verdicts: Verdicts, run: OpRun, outcomes: Sequence[OpRunOutcome], declared: Declarations, *,
                  label: str, names: list[str], kind: str) -> bool:
    """Whether a call of ``run`` raised; if one did, judge it as a refusal: clear on every rank (MUST), of the
    declared ``kind`` of error (SHOULD).

    The one rule for every case an implementation may refuse (token counts no
    tiling divides, strided operands): correct numbers or a clear refusal,
    never silent wrong rows -- the numbers are judged where nothing raised.
    """
    raised = [i for i in range(len(run.problems)) if any(i < len(o.calls) and o.calls[i].error is not None
                                                         for o in outcomes)]
    if not raised:
        return False
    call = raised[0]
    errors = [o.calls[call].error if call < len(o.calls) else None for o in outcomes]
    what = f"{run.op} {label}" + (f" (call {call})" if call else "")
    with verdicts.check(f"{label}: refused clearly", Level.MUST):
        checks.check_clear_refusal(errors, issued(outcomes, call), what=what, names=names)
    with verdicts.check(f"{label}: declared {kind} error", Level.SHOULD):
        first = next(e for e in errors if e is not None)
        checks.check_declared_error(first, declared.error_type(kind), kind=kind, what=what)
    return True


def check_bitwise_reproducible(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> None:
    """``deterministic=True``: every result of a call (each tiling, each run) bitwise equal to the first, and, with
    ``run.reference``, to the serial deterministic reference.  Of exact data, up to the sign of a zero (which
    a tile's own summation order decides)."""
    for rank, o in enumerate(outcomes):
        for index, (call, problem) in enumerate(zip(o.calls, run.problems)):
            name = f"{run.op} {problem.dtype} rank {rank}" + (f" call {index}" if index else "")
            results = [_plus_zero(r) for r in call.results] if problem.exact else call.results
            checks.check_bitwise_equal(name, results, what="run/tiling")
            reference = _plus_zero(call.reference) if problem.exact else call.reference
            if run.reference and not bitwise_equal(results[0], reference):
                raise DeterminismViolation(
                    f"{name}: differs bitwise from the serial deterministic reference "
                    f"({describe_difference(call.reference, call.results[0])})")


def _plus_zero(value: Any) -> Any:
    """``value`` with every zero ``+0`` (a tensor plus ``+0``; anything else as it is)."""
    return value + 0 if isinstance(value, torch.Tensor) and value.is_floating_point() else value
