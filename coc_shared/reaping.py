"""Reaping a fork server's children without blocking: the one loop both fork servers (the ranks' and the test
suite's pytest runs) run from their SIGCHLD handler.

Standard library only, so a fork server can import it before anything of the project it forks runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def reap_exited(on_exit: Callable[[int, int], None]) -> None:
    """Collect every child that has exited, calling ``on_exit(pid, exit code)`` for each (a signal's code is
    negative), until none is left to collect now."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        on_exit(pid, os.waitstatus_to_exitcode(status))
