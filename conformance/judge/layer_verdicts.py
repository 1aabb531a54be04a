"""The judging sequence of a layer job (one call of the patched layers, or a training), and of a layer case an
implementation may refuse.

The fixed suite (``conformance/suite/test_layers.py``, ``test_training.py``)
and the explorer (``conformance/explore/layer_training.py``) both judge with
these functions, under one set of check names, so a rule exists once and a
case the explorer finds fails the same named check as a suite test would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from conformance.contract.jobs import LayerJob
from conformance.contract.results import LayerOutcome
from conformance.judge import checks
from conformance.judge import layers as judge
from conformance.judge.attempts import Attempts, sort_attempts
from conformance.protocol import Declarations
from conformance.record.levels import Level
from conformance.record.verdicts import NotOffered, Verdicts

#: What a layer case records of an attempt every rank refused with ``NotImplementedError`` beside others.
OFFERED = "the patched layers are offered"


def sort_layer_attempts(verdicts: Verdicts, outcomes: Sequence[LayerOutcome], *, what: str,
                        refusal_allowed: bool = False) -> Attempts[str]:
    """The one rule of what a layer case judges when the patched layers raised, attempt by attempt
    (``conformance/judge/attempts.py``), the fixed suite's and the explorer's, for one call or a training.

    Nothing came back -- every attempt raised ``NotImplementedError`` on
    every rank -- and the case is not offered (:class:`NotOffered` raised);
    an attempt not offered beside others that came back is recorded so, and
    the others are judged.  An attempt that raised otherwise fails "the
    patched layers ran on every rank", unless the case allows a refusal
    (``refusal_allowed``: the caller judges it, :func:`judge_layer_refusal`).
    What came back is left to the checks that follow, which judge every
    output and gradient that came back on every rank.  Returns the attempts
    as sorted.
    """
    attempts = sort_attempts(judge.attempts_of(outcomes))
    if not attempts.offered:
        raise NotOffered(next(iter(attempts.not_offered.values()), "not implemented"))
    for why in dict.fromkeys(f"{what}, {re.sub(r'step [0-9]+, ', '', attempt)}: {why}"  # once, not once a step
                             for attempt, why in attempts.not_offered.items()):
        verdicts.not_offered(OFFERED, Level.MUST, why)
    if attempts.raised and not refusal_allowed:
        with verdicts.check("the patched layers ran on every rank", Level.MUST):
            judge.check_ran(outcomes, what, list(attempts.raised))
    return attempts


def layers_ran(outcomes: Sequence[LayerOutcome], what: str) -> None:
    """:func:`sort_layer_attempts` for a test that judges by its own assertions (it records no check): nothing
    came back and nothing was offered -- :class:`NotOffered`; an attempt that raised otherwise fails it."""
    attempts = sort_attempts(judge.attempts_of(outcomes))
    if not attempts.offered:
        raise NotOffered(next(iter(attempts.not_offered.values()), "not implemented"))
    judge.check_ran(outcomes, what, list(attempts.raised))


def judge_numerics(verdicts: Verdicts, job: LayerJob, outcomes: Sequence[LayerOutcome], *, chunks: int) -> None:
    """MUST: every output and gradient of every step, micro-batch and replica that came back lies within the error
    bound of the float64 truth (``chunks``: the count the bound allows for)."""
    with verdicts.check("numerics", Level.MUST):
        judge.check_training(job.problem, outcomes, tp=job.tp, chunks=chunks, evidence=verdicts.evidence,
                             fusion=job.main_grad, autocast=job.autocast)


def judge_layer_results(verdicts: Verdicts, job: LayerJob, outcomes: Sequence[LayerOutcome], *, chunks: int) -> None:
    """The checks of every layer job's results, each at its level (failures recorded, none raised), of what came
    back on every rank (:func:`sort_layer_attempts` judged what raised): numerics, values, replicated copies."""
    judge_numerics(verdicts, job, outcomes, chunks=chunks)
    with verdicts.check("results are values", Level.MUST):
        judge.check_values(outcomes)
    if judge.replicated(job.problem, job.tp):  # else (SP, TP 1) nothing is replicated: the check cannot apply
        with verdicts.check("replicated results bitwise identical", Level.SHOULD):
            judge.check_identical_copies(job.problem, outcomes, chunks=chunks, fusion=job.main_grad)


def judge_training(verdicts: Verdicts, job: LayerJob, outcomes: Sequence[LayerOutcome], *, chunks: int) -> None:
    """Every check of a training job: :func:`judge_layer_results`, and where gradients accumulate into
    ``main_grad``, that they land there once (MUST) and that the fusion is honoured (SHOULD)."""
    judge_layer_results(verdicts, job, outcomes, chunks=chunks)
    if job.main_grad:
        with verdicts.check("gradient lands in main_grad once", Level.MUST):
            judge.check_main_grad(outcomes)
        with verdicts.check("fusion honoured: gradient accumulated into main_grad", Level.SHOULD):
            judge.check_fusion_honoured(outcomes)


def layer_refusal_names(m: int, rows: int, chunks: int, tp: int) -> list[str]:
    """What a refusal of a layer's token count may name: the count, the rows per rank, the chunks, tp, the setting."""
    return [rf"\b({m}|{rows}|{chunks}|{tp})\b", r"\b(m|p|tp)\b", r"rows?", r"tokens?", r"chunk", r"parallel[-_ ]num"]


def judge_layer_refusal(verdicts: Verdicts, outcomes: Sequence[LayerOutcome], declared: Declarations, *,
                        label: str, what: str, names: list[str]) -> None:
    """A layer case some rank raised on, where a refusal is conforming: refused clearly on every rank, before any
    collective, naming what it refuses (MUST); the declared shape error (SHOULD)."""
    raised = sort_attempts(judge.attempts_of(outcomes)).raised
    errors = next(iter(raised.values())) if raised else [o.error for o in outcomes]  # the first attempt refused
    with verdicts.check(f"{label}: refused clearly on every rank", Level.MUST):
        checks.check_clear_refusal(errors, [o.collectives_before_error for o in outcomes], what=what, names=names)
    with verdicts.check(f"{label}: declared shape error", Level.SHOULD):
        first = next(e for e in errors if e is not None)
        checks.check_declared_error(first, declared.error_type("shape"), kind="shape", what=what)
