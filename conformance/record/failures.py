"""What a failed check says: its category in the report and its requirement level.

Every check failure is a :class:`CheckFailure` subclass; the class names the
report category, ``level`` the requirement the check states
(:class:`~conformance.record.levels.Level`).  A check picks the level when it
raises; the class gives the default.
"""

from __future__ import annotations

from conformance.record.levels import Level

#: Categories of failures that are no check's: a hang (timeout, crash, storm break), a known failure that passed
#: (the expectations file), the suite's own error.
HANG, UNEXPECTED_PASS, SUITE_ERROR = "hang", "unexpected pass", "suite error"


class CheckFailure(AssertionError):
    """A conformance check found the implementation wrong (category in the report)."""

    category = "failure"
    default_level = Level.MUST

    def __init__(self, message: str = "", *, level: Level | None = None) -> None:
        super().__init__(message)
        #: The level the raising check named (None: the test's level, else the class default).
        self.explicit_level = level

    @property
    def level(self) -> Level:
        return self.explicit_level or self.default_level

    @level.setter
    def level(self, value: Level) -> None:
        self.explicit_level = value


class NumericMismatch(CheckFailure):
    """A result outside the principled error bound of :mod:`conformance.judge.numerics`."""

    category = "numeric mismatch"


class ReplicaMismatch(NumericMismatch):
    """Ranks holding copies of one replicated tensor hold different bits (each copy may still be within the bound)."""

    default_level = Level.SHOULD


class DeterminismViolation(CheckFailure):
    """Results that should be bitwise reproducible were not."""

    category = "determinism violation"


class WrongError(CheckFailure):
    """An expected error was not raised, was of the wrong type, or not on every rank."""

    category = "missing or wrong error"


class StructureMismatch(CheckFailure):
    """The overlap is not achieved the way the implementation declares (or at all)."""

    category = "overlap structure"
    default_level = Level.STRUCTURE


class ContractViolation(CheckFailure):
    """A result that is not a value: wrong type or shape, changed after return, inputs mutated."""

    category = "result contract"


class PerfRegression(CheckFailure):
    """A performance gate of a matching hardware profile was missed."""

    category = "perf regression"


#: Every category, in the order the report lists them.
CATEGORIES: tuple[type[CheckFailure], ...] = (
    NumericMismatch, DeterminismViolation, WrongError, ContractViolation, StructureMismatch, PerfRegression,
)


class SuiteError(Exception):
    """A bug of the suite itself -- its references, judging or self-checks -- not of the implementation.

    Reported as an error of the run naming the suite, never as a failed check:
    a broken judge must not score an implementation.
    """

    @classmethod
    def wrapping(cls, where: str, exc: BaseException) -> SuiteError:
        first = (str(exc).strip().splitlines() or [""])[0]
        return cls(f"suite bug in {where}: {type(exc).__name__}: {first}")


def suite_requires(condition: bool, what: str) -> None:
    """A self-check of the suite (its own data or reference): raises :class:`SuiteError` when it does not hold."""
    if not condition:
        raise SuiteError(f"suite bug in a self-check: {what}")
