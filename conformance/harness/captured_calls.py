"""Implementation code called for its errors: every exception, a ``SystemExit`` and an ``os._exit`` in the pytest
process included, comes back as a value, never as the end of the run."""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from conformance.contract.rank_errors import CapturedError
from conformance.harness import rank_threads


def call_capturing_errors(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, CapturedError | None]:
    """``fn(*args, **kwargs)`` -> ``(value, None)``, or ``(None, error)`` for any Exception or SystemExit.

    A ``SystemExit`` (argparse refusing a flag) is an error like any other,
    carrying what was printed to stderr, instead of ending the process; so is
    ``os._exit`` in the pytest process (:func:`guard_exits`).
    """
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(Tee(stderr, sys.stderr)), exits_raise():
            return fn(*args, **kwargs), None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the error is the result
        return None, CapturedError.capture(exc, stderr=stderr.getvalue())


class ProcessExitCalled(SystemExit):
    """``os._exit`` called by implementation code running in the pytest process: an error of the call, never the
    end of the run (which would end with no summary, and exit 0 for ``os._exit(0)``)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"os._exit({code}) called in the test process (the implementation's code shares it with the "
                         "run: an exit there would end the run unrecorded)")
        self.exit_code = code


_real_exit: Callable[[int], Any] | None = None
#: Threads running implementation code in the pytest process now (:func:`exits_raise`), and how deep.
_guarded: dict[int, int] = {}


def guard_exits() -> None:
    """In the pytest process (once): ``os._exit`` raises :class:`ProcessExitCalled` on a thread running the
    implementation's code (inside :func:`exits_raise`), and exits as usual anywhere else (pytest's own, xdist's)."""
    global _real_exit
    import os

    if _real_exit is not None:
        return
    _real_exit = os._exit

    def _exit(code: int) -> Any:
        if threading.get_ident() in _guarded or rank_threads.rank_of() in _guarded:
            raise ProcessExitCalled(code)
        assert _real_exit is not None
        _real_exit(code)

    os._exit = _exit  # type: ignore[assignment]


@contextlib.contextmanager
def exits_raise() -> Iterator[None]:
    """Inside the block, where :func:`guard_exits` is in force, ``os._exit`` on this thread (or a helper working for
    its rank) raises :class:`ProcessExitCalled` instead of ending the process."""
    if _real_exit is None:
        yield
        return
    ident = threading.get_ident()
    _guarded[ident] = _guarded.get(ident, 0) + 1
    try:
        yield
    finally:
        _guarded[ident] -= 1
        if not _guarded[ident]:
            del _guarded[ident]


class Tee(io.TextIOBase):
    """Writes to every stream it was given."""

    def __init__(self, *streams: Any) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
            stream.flush()
        return len(text)
