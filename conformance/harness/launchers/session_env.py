"""The environment a session's ranks start with, where the process that forks them serves several sessions.

A session's own launcher forks its ranks from a fork server it started: the
ranks inherit the session's environment variables and working directory.  A
rank server shared by several sessions (``--coc-rank-server``,
``docs/DESIGN.md#rank-server``) was started by another session; each session
sends its :class:`SessionEnv`, pools are kept per session environment, and
their ranks take it on whole before they run anything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Variables of one pytest process, not of its session: a worker's name, the running test.
_PER_PROCESS = ("PYTEST_XDIST_", "PYTEST_CURRENT_TEST")


@dataclass(frozen=True)
class SessionEnv:
    """The environment variables and working directory a session's ranks start with, where the process that
    forks them is not that session's: a rank server shared by several sessions (``--coc-rank-server``).

    A pool serves one session environment; its ranks take it on whole (with
    their devices' visibility on top), as ranks forked for the session's own
    launcher inherit it.
    """

    variables: tuple[tuple[str, str], ...]
    cwd: str

    @classmethod
    def of(cls, environ: Mapping[str, str], cwd: str, path: Sequence[str]) -> SessionEnv:
        """A session's: ``environ`` less what differs between its pytest processes, ``PYTHONPATH`` its import path
        (``path``, as its own ranks get it)."""
        kept = {k: v for k, v in environ.items() if not k.startswith(_PER_PROCESS)}
        kept["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        return cls(tuple(sorted(kept.items())), cwd)

    @classmethod
    def here(cls) -> SessionEnv:
        """This process's session environment."""
        return cls.of(os.environ, os.getcwd(), sys.path)
