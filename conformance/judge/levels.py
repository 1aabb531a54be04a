"""Requirement levels: what kind of promise a check holds an implementation to.

* ``MUST``: what every correct implementation does -- numbers within the bound,
  bad settings refused on every rank before any collective, no silent wrong
  rows, determinism when asked, no hang.
* ``SHOULD``: what the feature documents but a correct implementation may do
  otherwise -- declared error types, one warning per ignored setting, the
  legacy environment variables, a fallback warning.
* ``STRUCTURE``: how the overlap is achieved, judged against what the
  implementation declares (``docs/DESIGN.md#overlap-structure``).

A test may hold several checks (:class:`Verdicts`); each is recorded with its
level, and ``--coc-gate`` chooses which levels fail the run.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any


class Level(str, enum.Enum):
    MUST = "MUST"
    SHOULD = "SHOULD"
    STRUCTURE = "STRUCTURE"

    @classmethod
    def parse_many(cls, text: str) -> frozenset[Level]:
        """``"must,structure"`` (case-insensitive; ``all`` for every level)."""
        words = {w.strip().upper() for w in text.split(",") if w.strip()}
        if words == {"ALL"}:
            return frozenset(cls)
        unknown = words - {level.value for level in cls}
        if unknown or not words:
            raise ValueError(f"unknown requirement level(s) {sorted(unknown) or [text]}; "
                             f"choose from {[level.value for level in cls]} or 'all'")
        return frozenset(cls(w) for w in words)


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
        from conformance.judge.failures import CheckFailure

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
