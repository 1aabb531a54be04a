"""Assertions shared by the suite: numerics, bitwise equality, expected errors.

Each raises a :class:`~conformance.record.failures.CheckFailure` subclass (so the
report files it under the right category) whose message says what was
expected, what was observed and where (rank, rows), and records its evidence
(:mod:`conformance.record.evidence`) for the report.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from conformance.contract.equality import bitwise_equal, describe_difference, wrong_cells
from conformance.contract.layouts import Split
from conformance.contract.rank_errors import CapturedError
from conformance.judge import numerics
from conformance.record.comparison import ErrorStats
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import DeterminismViolation, NumericMismatch, WrongError, suite_requires
from conformance.record.levels import Level
from conformance.record.verdicts import NotOffered


def check_close(name: str, out: Any, truth: Any, serial: Any, envelope: tuple[np.ndarray, int],
                dtype: Any, *, roundings: int, evidence: CaseEvidence, split: Split | None = None,
                tp: int = 1) -> ErrorStats:
    """``out`` within the bound of float64 ``truth`` (``docs/DESIGN.md#error-bound``).

    ``envelope`` is ``(|A| @ |B|, K)``; ``roundings`` the R of the bound; the comparison goes into the case's
    ``evidence``.  On a
    violation the message names the rows that are wrong and, given how the
    tensor is ``split`` over ``tp`` ranks, which rank holds them and where in
    its own shard (:func:`~conformance.contract.equality.wrong_cells`).
    """
    magnitude, reduction_len = envelope
    got, want = tuple(numerics.as_float64(out).shape), tuple(numerics.as_float64(truth).shape)
    if got != want:
        raise NumericMismatch(f"{name}: the result has shape {list(got)}, the expected one {list(want)}")
    comparison = numerics.compare(name, out, truth, serial, magnitude=magnitude,
                                  reduction_len=reduction_len, roundings=roundings, dtype=dtype)
    evidence.comparison(comparison, failed=not comparison.stats.ok)
    stats = comparison.stats
    if not stats.ok:
        where = stats.first_violation
        detail = ""
        if where is not None:
            detail = (f"; first at {list(where)}: got {_at(out, where):.6g}, expected (float64) "
                      f"{_at(truth, where):.6g}, serial {_at(serial, where):.6g}, bound "
                      f"{comparison.bound[where]:.3g}")
        if split is not None:
            detail += f"; on {wrong_cells(comparison.abs_diff > comparison.bound, split, tp)}"
        nonfinite = not np.isfinite(numerics.as_float64(out)).all()
        if nonfinite:
            detail += " (non-finite values: rows never written hold the poisoned fill)"
        raise NumericMismatch(stats.summary() + detail)
    return stats


def _at(a: Any, index: tuple[int, ...]) -> float:
    return float(numerics.as_float64(a)[index])


def check_bitwise_equal(name: str, runs: Sequence[Any], what: str = "run") -> None:
    """Every value in ``runs`` is bitwise identical to the first."""
    first = runs[0]
    for i, other in enumerate(runs[1:], start=1):
        if not bitwise_equal(first, other):
            raise DeterminismViolation(f"{name}: {what} {i} differs bitwise from {what} 0 "
                                       f"({describe_difference(first, other)})")


def require_offered(errors: Sequence[CapturedError | None]) -> None:
    """Raise :class:`~conformance.record.verdicts.NotOffered` when *every* rank, replica and call raised
    ``NotImplementedError`` (the mode is absent: the case, or the sub-case, is not offered).

    ``errors`` holds one entry per rank and call, None where it returned.  When
    some raise it and others return, the mode is there on some ranks only,
    which the checks that follow judge.  A case that recorded a failed check
    before stays failed (``conformance.record.verdicts.case_outcome``).
    """
    reason = not_implemented(errors)
    if reason:
        raise NotOffered(reason)


def not_implemented(errors: Sequence[CapturedError | None]) -> str:
    """Why the case has nothing to judge: every entry raised ``NotImplementedError`` ("" otherwise)."""
    if errors and all(e is not None and e.is_a("builtins.NotImplementedError") for e in errors):
        first = errors[0]
        return f"not implemented: {first.message if first is not None else ''}"
    return ""


def check_refused_on_every_rank(errors: Sequence[CapturedError | None], *, what: str,
                                patterns: Sequence[str] = (), level: Level = Level.MUST) -> None:
    """Every rank raised, the same error (class and message) on each, naming every ``patterns`` regex.

    Any exception class passes: the class is judged by :func:`check_declared_error`.
    """
    suite_requires(bool(errors), f"{what}: no rank's outcome to judge a refusal on")
    missing = [rank for rank, e in enumerate(errors) if e is None]
    if missing:
        raised = {rank: e.describe() for rank, e in enumerate(errors) if e is not None}
        raise WrongError(f"{what}: expected an error on every rank; rank(s) {missing} raised none"
                         + (f" (others raised: {raised})" if raised else ""), level=level)
    present = [e for e in errors if e is not None]
    first = present[0]
    different = {rank: e.describe() for rank, e in enumerate(present) if not e.same_as(first)}
    if different:
        raise WrongError(f"{what}: ranks raised different errors: rank 0 {first.describe()}; "
                         f"{different}", level=level)
    for pattern in patterns:
        if not re.search(pattern, first.message, re.IGNORECASE):
            raise WrongError(f"{what}: the error on every rank ({first.describe()}) does not name "
                             f"{pattern!r}", level=level)


def check_clear_refusal(errors: Sequence[CapturedError | None], collectives: Sequence[Sequence[str]], *, what: str,
                        names: Sequence[str]) -> None:
    """MUST (the alternative to correct numbers): a *clear* refusal, not any exception.

    Every rank raised the same error before issuing any collective
    (``collectives``: per rank, what it issued before raising), and the message
    names what it refuses: one of the ``names`` regexes (m, p, tp, the setting).
    A crash inside a collective, or a ``TypeError`` from the implementation's
    own bug, is not a refusal.
    """
    check_refused_on_every_rank(errors, what=what)
    first = next(e for e in errors if e is not None)
    issued = {rank: list(kinds) for rank, kinds in enumerate(collectives) if kinds}
    if issued:
        raise WrongError(f"{what}: not a clear refusal: {first.describe()} was raised after collectives had run "
                         f"({issued}); a refusal comes before any collective, or a peer still in one hangs")
    if not any(re.search(name, first.message, re.IGNORECASE) for name in names):
        raise WrongError(f"{what}: not a clear refusal: {first.describe()} names none of what it refuses "
                         f"(expected one of {list(names)})")


def check_declared_error(error: CapturedError, declared: Any, *, kind: str, what: str) -> None:
    """SHOULD: ``error`` is (a subclass of) the class the implementation declares for ``kind``.

    ``declared`` is a class or a tuple of classes (protocol v2 ``error_types``),
    or None when the implementation declares nothing for this kind.
    """
    if declared is None:
        raise WrongError(f"{what}: raised {error.describe()}; the implementation declares no error type "
                         f"for {kind!r} errors (protocol v2 'error_types')", level=Level.SHOULD)
    classes = declared if isinstance(declared, tuple) else (declared,)
    if not error.is_a(*classes):
        names = ", ".join(c.__qualname__ for c in classes)
        raise WrongError(f"{what}: raised {error.type_name}, not the declared {kind!r} error type ({names}): "
                         f"{error.message}", level=Level.SHOULD)
