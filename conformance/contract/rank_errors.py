"""An error a rank captured: what a task returns of an exception, judged like any other result.

A plain picklable record (the class's qualified name and bases, the message, the traceback, the exception itself
when it pickles), made on the rank by the harness and read by the checks.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class CapturedError:
    """An exception raised on a rank, carried back as text (and the object when picklable).

    Used both for an exception that escaped a task and for one a task caught
    from the implementation on purpose (an expected error is a result).
    """

    type_name: str  #: ``module.QualName``
    message: str
    traceback: str
    mro: tuple[str, ...] = ()  #: ``module.QualName`` of every class, most derived first
    exception: BaseException | None = None

    @classmethod
    def capture(cls, exc: BaseException, *, stderr: str = "") -> CapturedError:
        """Capture ``exc``; ``stderr`` is what the call printed there (argparse's message on SystemExit)."""
        import pickle

        try:
            pickle.loads(pickle.dumps(exc))
            carried: BaseException | None = exc
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
            carried = None
        return cls(
            type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
            message=_message(exc, stderr),
            traceback="".join(traceback.format_exception(exc)),
            mro=tuple(qualified_name(c) for c in type(exc).__mro__),
            exception=carried,
        )

    @property
    def name(self) -> str:
        """The class name alone."""
        return self.type_name.rsplit(".", 1)[-1]

    def is_a(self, *classes: type[BaseException] | str) -> bool:
        """Whether the class or one of its bases is one of ``classes`` (classes or qualified names)."""
        wanted = {c if isinstance(c, str) else qualified_name(c) for c in classes}
        return not wanted.isdisjoint(self.mro)

    def same_as(self, other: CapturedError) -> bool:
        """Same class and same message (what "the same error on every rank" means)."""
        return (self.type_name, self.message) == (other.type_name, other.message)

    def describe(self) -> str:
        return f"{self.name}: {self.message}"


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _message(exc: BaseException, stderr: str = "") -> str:
    """``str(exc)``, with what a bare ``SystemExit`` (argparse: an exit status, no message) leaves out: its stderr
    message."""
    text = str(exc)
    if isinstance(exc, SystemExit) and not isinstance(exc.code, str):  # one with a message says why itself
        said = [line for line in stderr.strip().splitlines() if line.strip()]
        why = said[-1].strip() if said else "nothing printed to stderr"
        return f"SystemExit({exc.code!r}) -- argparse exits on a bad or unknown flag: {why}"
    return text
