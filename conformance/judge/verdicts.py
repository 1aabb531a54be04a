"""The named checks of one test, each recorded with its requirement level and its outcome.

A check passes, fails, or is *not judged*: nothing was there to judge (a phase
declared ``none``, a perf gate not enforced on this machine, a check about
chunking for an implementation that does not chunk).  Not judged is never
counted as passed, so a score says what was actually checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from conformance.harness.case_errors import CaseError
from conformance.judge.failures import CheckFailure
from conformance.judge.levels import Level

PASSED, FAILED, NOT_JUDGED = "passed", "failed", "not judged"
#: Every outcome a check can have, in the order reports list them.
OUTCOMES = (PASSED, FAILED, NOT_JUDGED)


class NotJudged(Exception):
    """Raised inside a check when there is nothing to judge; the message says why."""


@dataclass(frozen=True)
class CheckResult:
    """One named check of a test and how it came out."""

    name: str
    level: Level
    passed: bool
    message: str = ""
    category: str = ""
    outcome: str = ""
    seconds: float | None = None  #: the time judging took (the report's step time); None when not measured

    def __post_init__(self) -> None:
        if not self.outcome:
            object.__setattr__(self, "outcome", PASSED if self.passed else FAILED)

    @property
    def failed(self) -> bool:
        return self.outcome == FAILED

    def as_dict(self) -> dict[str, Any]:
        record = {**asdict(self), "level": self.level.value}
        if self.seconds is None:
            del record["seconds"]
        return record


def outcome_of(check: Mapping[str, Any]) -> str:
    """The outcome of a check as a report carries it (summaries written before ``outcome`` existed too)."""
    return str(check.get("outcome") or (PASSED if check.get("passed") else FAILED))


class Verdicts:
    """The checks of one test, each at its level.

    ``with verdicts.check("numerics", Level.MUST): ...`` records a pass, the
    :class:`~conformance.judge.failures.CheckFailure` (or plain assertion)
    raised inside, or :class:`NotJudged`, and goes on, so later checks of the
    same run are still judged.  Hangs and crashes
    (:class:`~conformance.harness.case_errors.CaseError`) are not a check's
    verdict: they propagate, and stay MUST whatever the check's level.
    The test fails at the end if a failed check's level gates.
    """

    def __init__(self) -> None:
        self.results: list[CheckResult] = []
        self.exceptions: list[BaseException] = []

    @contextmanager
    def check(self, name: str, level: Level) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except CaseError:
            raise
        except NotJudged as why:
            self.not_judged(name, level, str(why))
        except (CheckFailure, AssertionError) as failure:
            category = failure.category if isinstance(failure, CheckFailure) else "failure"
            self.results.append(CheckResult(name, level, False, str(failure), category,
                                            seconds=round(time.perf_counter() - start, 6)))
            if isinstance(failure, CheckFailure):
                failure.level = level
            self.exceptions.append(failure)
        else:
            self.results.append(CheckResult(name, level, True, seconds=round(time.perf_counter() - start, 6)))

    def not_judged(self, name: str, level: Level, reason: str) -> None:
        """Record that check ``name`` had nothing to judge here, and why."""
        self.results.append(CheckResult(name, level, False, reason, outcome=NOT_JUDGED))

    def failed(self, levels: Iterable[Level] | None = None) -> list[BaseException]:
        """The failures whose level is in ``levels`` (all when None)."""
        chosen = None if levels is None else set(levels)
        return [exc for exc, result in zip(self.exceptions, (r for r in self.results if r.failed), strict=True)
                if chosen is None or result.level in chosen]
