"""The named checks of one test, each recorded with its requirement level, pass or fail."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from conformance.judge.failures import CheckFailure
from conformance.judge.levels import Level


@dataclass(frozen=True)
class CheckResult:
    """One named check of a test and how it came out."""

    name: str
    level: Level
    passed: bool
    message: str = ""
    category: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "level": self.level.value}


class Verdicts:
    """The checks of one test, each at its level.

    ``with verdicts.check("numerics", Level.MUST): ...`` records a pass, or the
    :class:`~conformance.judge.failures.CheckFailure` (or plain assertion)
    raised inside, and goes on, so later checks of the same run are still
    judged.  The test fails at the end if a failed check's level gates.
    """

    def __init__(self) -> None:
        self.results: list[CheckResult] = []
        self.exceptions: list[BaseException] = []

    @contextmanager
    def check(self, name: str, level: Level) -> Iterator[None]:
        try:
            yield
        except (CheckFailure, AssertionError) as failure:
            category = failure.category if isinstance(failure, CheckFailure) else "failure"
            self.results.append(CheckResult(name, level, False, str(failure), category))
            if isinstance(failure, CheckFailure):
                failure.level = level
            self.exceptions.append(failure)
        else:
            self.results.append(CheckResult(name, level, True))

    def failed(self, levels: Iterable[Level] | None = None) -> list[BaseException]:
        """The failures whose level is in ``levels`` (all when None)."""
        chosen = None if levels is None else set(levels)
        return [exc for exc, result in zip(self.exceptions, (r for r in self.results if not r.passed),
                                           strict=True)
                if chosen is None or result.level in chosen]
