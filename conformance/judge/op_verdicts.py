"""The judging sequence of one op run: the suite's checks, each at its level, in the order the suite states them.

The fixed suite (``conformance/suite/test_ops.py``) and the explorer
(``conformance/explore/``) both judge an :class:`~conformance.contract.jobs.OpRun`
with this one function, so a rule exists once and a case the explorer finds
fails the same named check as a suite test would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conformance.contract.jobs import OpRun
from conformance.contract.results import OpRunOutcome
from conformance.judge import checks
from conformance.judge import ops as judge
from conformance.judge.attempts import sort_attempts
from conformance.judge.determinism import (
    check_across_launches,
    check_reproducible,
    check_split_invariant,
    nothing_to_compare,
)
from conformance.judge.ops import Attempt
from conformance.protocol import Declarations
from conformance.record.levels import Level
from conformance.record.verdicts import NotJudged, Verdicts

#: What a refusal of strided operands may name.
STRIDE_NAMES = [r"contiguous", r"strides?", r"layout", r"view", r"offset", r"\bw\b|weight", r"\bx\b"]


def judge_op_runs(verdicts: Verdicts, judged: Sequence[tuple[OpRun, Sequence[OpRunOutcome]]],
                  in_place_ops: frozenset[str] = frozenset(), *, exact: bool = False) -> None:
    """Record every check of each ``(run, its outcomes on every rank)`` into ``verdicts`` (failures recorded, none
    raised); a call sequence's runs are judged together, one verdict per check.  No run, no check: nothing to
    judge is never a pass.  Every attempt that came back is judged (``conformance/judge/attempts.py``), whatever
    the others did; one that raised fails "the op ran on every rank" unless it was a refusal the case allows (judged
    as one by :func:`judge_refusal`) or not offered.  "replicated results bitwise identical" is recorded only where
    a result is replicated (held whole by more than one rank: not a reduce-scatter's, not at TP 1)."""
    if not judged:
        return
    with verdicts.check("the op ran on every rank", Level.MUST):
        for run, outcomes in judged:
            judge.check_ran(run, outcomes, excused=refusals(run, outcomes))
    with verdicts.check("results are values", Level.MUST):
        for run, outcomes in _came_back(judged, everywhere=False):
            judge.check_contract(run, outcomes, in_place_ops)
    with verdicts.check("numerics" if not exact else "exact layout", Level.MUST):
        for run, outcomes in _came_back(judged):
            judge.check_numerics(run, outcomes, evidence=verdicts.evidence, exact=exact)
    if not any(judge.replicated(run) for run, _ in judged):
        return
    with verdicts.check("replicated results bitwise identical", Level.SHOULD):
        compared = 0
        for run, outcomes in _came_back(judged):
            compared += judge.check_identical_copies(run, outcomes)
        if not compared:
            raise NotJudged("no replicated result was held as a tensor by two ranks: no copies to compare")


def _came_back(judged: Sequence[tuple[OpRun, Sequence[OpRunOutcome]]], *, everywhere: bool = True
               ) -> list[tuple[OpRun, Sequence[OpRunOutcome]]]:
    """The runs of which some attempt came back -- on every rank (``everywhere``), or on some rank -- else not
    judged: every call raised ("the op ran on every rank" says how), nothing came back to judge."""
    found = [(run, outcomes) for run, outcomes in judged
             if any(judge.returned_everywhere(outcomes if everywhere else [o], i)
                    for o in outcomes for i in range(len(run.problems)))]
    if not found:
        raise NotJudged("no call came back" + (" on every rank" if everywhere else "")
                        + ": every attempt raised (the op ran on every rank says how), nothing to judge")
    return found


def refusal_names(m: int, tp: int) -> list[str]:
    """What a refusal of ``m`` rows may name: the token count, tp, rows, the setting."""
    return [rf"\b{m}\b", rf"\b{m // tp}\b" if m >= tp else rf"\b{m}\b", r"\bm\b", r"\btp\b", r"\brows?\b",
            r"tokens?", r"chunk", r"tile|tiling|block"]


def rows_per_rank(op: str, m: int, tp: int) -> int:
    """The rows of a call of ``op`` each rank's matmul tiles: all of ``m`` for the all-reduce, ``m / tp`` else."""
    return m if op == "matmul_all_reduce" else m // tp


@dataclass(frozen=True)
class MayRefuse:
    """Why a call may be refused, and how its refusal is judged: what it must name, the declared error kind."""

    label: str
    names: tuple[str, ...]
    kind: str


def refusal_rule(run: OpRun, call: int = 0) -> MayRefuse | None:
    """Whether call ``call`` of ``run`` may be refused, and how (None: it must run, and a refusal fails
    "the op ran on every rank").

    The one refusal rule of the op checks, the fixed suite's and the
    explorer's: strided operands (a kernel may need contiguous ones), and a
    token count no even tiling divides -- an odd number of rows per rank (1,
    3, 7, 13, 61 in the fixed suite).  Any other call must give correct
    numbers: a build refusing ordinary calls does not conform.
    """
    problem = run.problems[call]
    uneven = rows_per_rank(run.op, problem.m, run.tp) % 2 == 1
    token_names = tuple(refusal_names(problem.m, run.tp)) if uneven else ()
    if run.strides != "contiguous":
        return MayRefuse(f"{run.strides} operands", tuple(STRIDE_NAMES) + token_names, "argument")
    if uneven:
        return MayRefuse("token counts", token_names, "shape")
    return None


def issued(outcomes: Sequence[OpRunOutcome], call: int = 0, attempt: int | None = None) -> list[list[str]]:
    """Per rank, the collectives its ``call`` (its ``attempt`` only, when given) issued (before it raised, when it
    did), those of another thread of the rank too (not recorded, but issued)."""
    def timelines(o: OpRunOutcome) -> list[Any]:
        if call >= len(o.calls):
            return []
        seen = o.calls[call].timelines
        return seen if attempt is None else seen[attempt:attempt + 1]

    return [[c.kind for t in timelines(o) for c in t.collectives]
            + [f"{name} (another thread)" for t in timelines(o) for name in t.other_threads] for o in outcomes]


def refusals(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> frozenset[Attempt]:
    """The attempts of ``run`` that raised where :func:`refusal_rule` allows a refusal (:func:`judge_refusal`
    judges them as refusals; "the op ran on every rank" does not)."""
    return frozenset(attempt for attempt in sort_attempts(judge.attempts_of(outcomes)).raised
                     if refusal_rule(run, attempt[0]) is not None)


def judge_refusal(verdicts: Verdicts, run: OpRun, outcomes: Sequence[OpRunOutcome], declared: Declarations, *,
                  label: str = "") -> bool:
    """Whether an attempt of ``run`` raised where :func:`refusal_rule` allows a refusal; if one did, judge the first
    as a refusal: clear on every rank (MUST), of the declared kind of error (SHOULD).

    Correct numbers or a clear refusal, never silent wrong rows -- the
    numbers are judged where nothing raised.  An attempt that raised where no
    refusal is allowed is left to the op checks ("the op ran on every rank").
    ``label`` names the checks (default: the rule's).
    """
    excused = sorted(refusals(run, outcomes))
    if not excused:
        return False
    call, attempt = excused[0]
    rule = refusal_rule(run, call)
    assert rule is not None
    errors = [o.calls[call].errors[attempt] for o in outcomes]
    label = label or rule.label
    what = f"{run.op} {label}" + (f" (call {call})" if call else "")
    with verdicts.check(f"{label}: refused clearly", Level.MUST):
        checks.check_clear_refusal(errors, issued(outcomes, call, attempt), what=what, names=rule.names)
    with verdicts.check(f"{label}: declared {rule.kind} error", Level.SHOULD):
        first = next(e for e in errors if e is not None)
        checks.check_declared_error(first, declared.error_type(rule.kind), kind=rule.kind, what=what)
    return True


@dataclass(frozen=True)
class Sorted:
    """The runs of an op case as the one refusal rule sorts them (:func:`sort_refusals`)."""

    to_judge: list[tuple[OpRun, Sequence[OpRunOutcome]]]  #: the runs the op checks judge
    not_offered: list[tuple[OpRun, str]]  #: the runs the implementation does not offer at all, and why


def sort_refusals(verdicts: Verdicts, judged: Sequence[tuple[OpRun, Sequence[OpRunOutcome]]],
                  declared: Declarations, *, label: str = "") -> Sorted:
    """The one rule of what an op case judges when calls raised, the fixed suite's, the explorer's and the corpus's,
    for one op or a sequence of several, attempt by attempt (``conformance/judge/attempts.py``).

    A run (a stretch of calls of one op) none of whose attempts came back --
    every one raised ``NotImplementedError`` on every rank -- is *not
    offered* (recorded so, with why: never a failure, never a pass); an
    attempt not offered beside others that came back is recorded not offered
    and the others are judged.  An attempt that raised where
    :func:`refusal_rule` allows a refusal is judged as a refusal
    (:func:`judge_refusal`); every run with an attempt that came back, or
    raised otherwise, is left to the op checks, where what came back is
    judged and the rest fails "the op ran on every rank".  The other runs of a
    sequence are judged whatever one run did.
    """
    to_judge, not_offered = [], []
    name = f"{label}: the op is offered" if label else "the op is offered"
    for run, outcomes in judged:
        attempts = sort_attempts(judge.attempts_of(outcomes))
        if not attempts.offered:
            why = next(iter(attempts.not_offered.values()), "not implemented")
            not_offered.append((run, why))
            verdicts.not_offered(name, Level.MUST, f"{run.op}: {why}")
            continue
        for what in dict.fromkeys(f"{run.op} {judge.attempt_label(run, attempt, repeat=False)}: {why}"
                                  for attempt, why in attempts.not_offered.items()):
            verdicts.not_offered(name, Level.MUST, what)
        refused = judge_refusal(verdicts, run, outcomes, declared, label=label)
        if attempts.returned or not refused or set(attempts.raised) - refusals(run, outcomes):
            to_judge.append((run, outcomes))
    return Sorted(to_judge, not_offered)


def judge_deterministic(verdicts: Verdicts, judged: Sequence[tuple[OpRun, Sequence[OpRunOutcome]]],
                        split_invariant_ops: frozenset[str] = frozenset()) -> None:
    """``deterministic=True`` (``conformance/judge/determinism.py``): every run of a call under one tiling bitwise
    the first (MUST); for the ops declared split-invariant on this device, every tiling bitwise the first (MUST),
    for the others not judged -- their tilings are judged by the error bound, with the op checks.  Compared: the
    attempts that came back on every rank; not judged where nothing was there to compare; nothing recorded for no
    run (all refused)."""
    if not judged:
        return
    with verdicts.check("deterministic: bitwise reproducible", Level.MUST):
        compared = 0
        for run, outcomes in judged:
            why = nothing_to_compare(runs=run.runs, exact=any(p.exact for p in run.problems))
            if why:
                raise NotJudged(f"{run.op}: {why}")
            compared += check_reproducible(run, outcomes)
        if not compared:
            raise NotJudged("no tiling came back twice on every rank: no result to be reproducible against")
    tiled = [(run, outcomes) for run, outcomes in judged if len(run.tilings) > 1]
    if not tiled:
        return  # one tiling: nothing split, no split-invariance check to record
    with verdicts.check("split-invariant: bitwise across tilings", Level.MUST):
        declared = [(run, outcomes) for run, outcomes in tiled if run.op in split_invariant_ops]
        if not declared:
            raise NotJudged(f"{sorted({run.op for run, _ in tiled})} declared no split invariance on this device "
                            "(split_invariant_ops): the tilings are judged by the error bound")
        if not sum(check_split_invariant(run, outcomes) for run, outcomes in declared):
            raise NotJudged("no two tilings came back on every rank: no tiling to compare with another")


def judge_across_launches(verdicts: Verdicts, launches: Sequence[tuple[OpRun, Sequence[Sequence[OpRunOutcome]]]],
                          *, why_not: str = "") -> None:
    """``deterministic=True`` across launches (MUST): each ``(run, its outcomes in each launch)``, the later launches
    on fresh ranks -- other processes, other arrival orders and late ranks -- gives the first launch's bits
    (``conformance/judge/determinism.py``).  Not judged where the launcher starts no fresh ranks (``why_not``)
    or nothing came back in two launches; nothing recorded for no run (all refused)."""
    if not launches:
        return
    with verdicts.check("deterministic: bitwise across launches", Level.MUST):
        if why_not:
            raise NotJudged(why_not)
        compared = sum(check_across_launches(run, outcomes[0], again) for run, outcomes in launches
                       for again in outcomes[1:])
        if not compared:
            raise NotJudged("no tiling came back on every rank in two launches: nothing to compare")
