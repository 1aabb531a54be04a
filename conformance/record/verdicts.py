"""The named checks of one test, each recorded with its requirement level and its outcome.

A check passes, fails, is *not judged* -- nothing was there to judge (a phase
declared ``none``, a perf gate not enforced on this machine, a check about
chunking for an implementation that does not chunk, nothing replicated to
compare) -- or is *not offered*: the implementation does not offer what the
case (or one sub-case of it) needs, saying so with ``NotImplementedError`` on
every rank or lacking the op.  Neither is ever counted as passed, so a score
says what was actually checked.

A case's outcome follows from its record by one rule (:func:`case_outcome`):
a failed check fails it, whatever came after (a skip, a refusal, nothing
judged); else it is not offered when every record is, not judged when none
passed, and passed otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from conformance.harness.case_errors import CaseError
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import CheckFailure
from conformance.record.levels import Level

PASSED, FAILED, NOT_JUDGED, NOT_OFFERED = "passed", "failed", "not judged", "not offered"
#: Every outcome a check can have, in the order reports list them.
OUTCOMES = (PASSED, FAILED, NOT_JUDGED, NOT_OFFERED)
#: The outcomes of a check that judged the implementation (the others judged nothing).
JUDGED = (PASSED, FAILED)


class NotJudged(Exception):
    """Raised inside a check when there is nothing to judge; the message says why."""


class NotOffered(Exception):
    """Raised when the implementation does not offer what a case (or a sub-case) needs; the message says why."""


@dataclass(frozen=True)
class CheckResult:
    """One named check of a test and how it came out."""

    name: str
    level: Level
    outcome: str  #: one of :data:`OUTCOMES`
    message: str = ""
    category: str = ""
    seconds: float | None = None  #: the time judging took (the report's step time); None when not measured

    @property
    def passed(self) -> bool:
        return self.outcome == PASSED

    @property
    def failed(self) -> bool:
        return self.outcome == FAILED

    def as_dict(self) -> dict[str, Any]:
        record = {**asdict(self), "level": self.level.value, "passed": self.passed}
        if self.seconds is None:
            del record["seconds"]
        return record


def outcome_of(check: Mapping[str, Any]) -> str:
    """The outcome of a check as a report carries it (summaries written before ``outcome`` existed too)."""
    return str(check.get("outcome") or (PASSED if check.get("passed") else FAILED))


def case_outcome(outcomes: Iterable[str]) -> str:
    """The outcome of a case from its checks' outcomes: failed once any check failed (sticky: nothing after a
    failure undoes it), else not offered when every check was not offered, else not judged when none passed,
    else passed.  No check at all is passed: a case without a record judged by its own assertions."""
    seen = set(outcomes)
    if FAILED in seen:
        return FAILED
    if seen and seen <= {NOT_OFFERED}:
        return NOT_OFFERED
    if seen and PASSED not in seen:
        return NOT_JUDGED
    return PASSED


class Verdicts:
    """The checks of one test, each at its level, and the evidence they saw (:attr:`evidence`).

    ``with verdicts.check("numerics", Level.MUST): ...`` records a pass, the
    :class:`~conformance.record.failures.CheckFailure` (or plain assertion)
    raised inside, or :class:`NotJudged`, and goes on, so later checks of the
    same run are still judged.  Hangs and crashes
    (:class:`~conformance.harness.case_errors.CaseError`) are not a check's
    verdict: they propagate, and stay MUST whatever the check's level.
    The test fails at the end if a failed check's level gates.
    """

    def __init__(self) -> None:
        self.results: list[CheckResult] = []
        self.exceptions: list[BaseException] = []  #: what each failed check raised, in the order of ``results``
        self.evidence = CaseEvidence()

    @contextmanager
    def check(self, name: str, level: Level) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except CaseError:
            raise
        except NotJudged as why:
            self.not_judged(name, level, str(why))
        except NotOffered as why:
            self.not_offered(name, level, str(why))
        except (CheckFailure, AssertionError) as failure:
            if isinstance(failure, CheckFailure):
                failure.level = level
            self.fail(name, level, str(failure), error=failure,
                      category=failure.category if isinstance(failure, CheckFailure) else "failure",
                      seconds=round(time.perf_counter() - start, 6))
        else:
            self.results.append(CheckResult(name, level, PASSED, seconds=round(time.perf_counter() - start, 6)))

    def fail(self, name: str, level: Level, message: str, *, category: str = "failure",
             error: BaseException | None = None, seconds: float | None = None) -> None:
        """Record that check ``name`` failed at ``level``, saying ``message``.  ``error`` is what says so when the
        case concludes (:meth:`failed`): the exception the check raised, else a
        :class:`~conformance.record.failures.CheckFailure` of the message, so a failure is recorded without
        being raised."""
        if error is None:
            error = CheckFailure(message, level=level)
            error.category = category
        self.results.append(CheckResult(name, level, FAILED, message, category, seconds=seconds))
        self.exceptions.append(error)

    @contextmanager
    def sub_case(self, label: str, level: Level = Level.MUST) -> Iterator[None]:
        """One sub-case of a test that loops over several: one the implementation does not offer
        (:class:`NotOffered` raised inside) is recorded as such under ``label`` and the loop goes on, so a later
        sub-case is still judged and an earlier failure still fails the case (:func:`case_outcome`)."""
        try:
            yield
        except NotOffered as why:
            self.not_offered(label, level, str(why))

    def not_judged(self, name: str, level: Level, reason: str) -> None:
        """Record that check ``name`` had nothing to judge here, and why."""
        self.results.append(CheckResult(name, level, NOT_JUDGED, reason))

    def not_offered(self, name: str, level: Level, reason: str) -> None:
        """Record that the implementation does not offer what ``name`` needs, and why."""
        self.results.append(CheckResult(name, level, NOT_OFFERED, reason))

    @property
    def outcome(self) -> str:
        """The outcome of the case so far (:func:`case_outcome` of every check recorded)."""
        return case_outcome(r.outcome for r in self.results)

    def failed(self, levels: Iterable[Level] | None = None) -> list[BaseException]:
        """The failures whose level is in ``levels`` (all when None)."""
        chosen = None if levels is None else set(levels)
        return [exc for exc, result in zip(self.exceptions, (r for r in self.results if r.failed), strict=True)
                if chosen is None or result.level in chosen]
