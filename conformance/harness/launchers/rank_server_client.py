"""Both ends of the session's rank server (:mod:`conformance.harness.launchers.rank_server`) outside it.

:class:`RankServer` is the xdist controller's handle: it starts the server
once per session and stops it at the end.  :class:`ServerLauncher` is what
each worker runs cases through: a :class:`~conformance.harness.launchers.Launcher`
that sends them to the server over one connection.  :func:`why_not_shared`
says whether a session may run its cases on another session's server
(``--coc-rank-server``).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from conformance.harness import wire
from conformance.harness.case import RankOutcome, RankTask
from conformance.harness.case_errors import RankCrashed
from conformance.harness.launchers.code_key import code_key
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.rank_server import ServerSettings
from conformance.harness.launchers.session_env import SessionEnv
from conformance.harness.launchers.subprocesses import end_process

_LOG = "server.log"


def _log_tail(directory: Path) -> str:
    try:
        return (directory / _LOG).read_text(errors="replace")[-4000:]
    except OSError:
        return ""


class RankServer:
    """The controller's handle on the session's rank server: started here, stopped by :meth:`close`."""

    def __init__(self, kind: DeviceKind, *, max_live_ranks: int, num_threads: int = 1,
                 start_timeout_s: float = 60.0) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="coc-ranks-"))  # private (0700): only this user connects
        self.address = str(self.directory / "ranks.sock")
        settings = self.directory / "settings.pickle"
        settings.write_bytes(pickle.dumps(ServerSettings(self.address, kind, max_live_ranks, num_threads)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(self.directory / _LOG, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "conformance.harness.launchers.rank_server", str(settings)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            )
        assert self._proc.stdout is not None
        ready = threading.Timer(start_timeout_s, self._proc.kill)  # a server that never answers is killed
        ready.start()
        try:
            line = self._proc.stdout.readline().strip()
        finally:
            ready.cancel()
        if line != b"ready":
            self.close()
            raise RankCrashed(f"the session's rank server did not start (exit code {self._proc.poll()}):\n"
                              f"{_log_tail(self.directory)}")

    def close(self) -> None:
        """Stop the server (it closes every pool) and remove its files."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        end_process(self._proc, grace_s=60)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def why_not_shared(address: str, kind: DeviceKind) -> str | None:
    """Why this session may not run its cases on the rank server at ``address`` (None: it may): the server is
    gone, runs other code (:func:`~conformance.harness.launchers.code_key.code_key`), or other devices."""
    try:
        with Client(address, family="AF_UNIX") as conn:
            conn.send_bytes(pickle.dumps(("identity",)))
            _, identity, _ = pickle.loads(conn.recv_bytes())
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
        return f"no rank server answers at {address} ({exc!r})"
    if identity.get("code_key") != code_key():
        return "it runs other code than this session (its checkout or interpreter differs, or changed since)"
    if (identity.get("device"), identity.get("backend")) != (kind.name, kind.backend):
        return (f"it runs {identity.get('device')} ranks over {identity.get('backend')}, this session "
                f"{kind.name} ranks over {kind.backend}")
    return None


class ServerLauncher:
    """Runs a worker's cases on the session's rank server at ``address``.

    ``preload``: modules the server's fork server should import before its
    first fork (megatron-core when the session runs layer cases).
    ``binds_devices``: whether pools are bound to their devices (else no
    device set is preferred, and none is asked for).  ``session``: this
    session's environment, where the server is another session's (its cases
    run on pools of their own); ``releases``: :meth:`close` closes the
    session's idle pools there (the session has ended: its one process, or
    its xdist controller).
    """

    relaunches = True  #: the server's process launcher starts fresh ranks for a task that asks

    name = "process"

    def __init__(self, address: str, preload: Sequence[str] = (), *, binds_devices: bool = True,
                 session: SessionEnv | None = None, releases: bool = False) -> None:
        self.address = address
        self._preload = tuple(preload)
        self._binds_devices = binds_devices
        self.session = session
        self._releases = releases and session is not None
        self._conn: Connection | None = None
        #: Seconds the last :meth:`run` spent starting ranks (0 when its pool was warm).
        self.last_start_s = 0.0

    def _ask(self, *request: Any) -> Any:
        """Send one request; its value, or raise its error (``last_start_s`` says what starting ranks took)."""
        try:
            if self._conn is None:
                self._conn = Client(self.address, family="AF_UNIX")
            self._conn.send_bytes(pickle.dumps(request))
            status, value, self.last_start_s = pickle.loads(self._conn.recv_bytes())
        except (OSError, EOFError) as exc:
            self._conn = None
            raise RankCrashed(f"the session's rank server at {self.address} is gone ({exc!r}):\n"
                              f"{_log_tail(Path(self.address).parent)}") from None
        if status == "raised":
            raise value
        return value

    def prestart(self) -> None:
        """Have the server start its fork server now (it imports torch while this worker collects)."""
        self._ask("prestart")

    def want_preloaded(self, names: Sequence[str], *, now: bool = False) -> None:
        """Ask the server's fork server to import ``names`` too (as :meth:`ProcessLauncher.want_preloaded
        <conformance.harness.launchers.process_launcher.ProcessLauncher.want_preloaded>`)."""
        self._preload += tuple(n for n in names if n not in self._preload)
        if now:
            self._ask("preload", self._preload)

    def warm(self, world_sizes: Sequence[int]) -> None:
        """Ask the server to start pools of these sizes ahead of the cases (as :meth:`ProcessLauncher.warm
        <conformance.harness.launchers.process_launcher.ProcessLauncher.warm>`; the first worker's list counts)."""
        self._ask("warm", tuple(world_sizes), self.session)

    def preferred_devices(self, world_size: int) -> tuple[str, ...]:
        """The devices of the server's most recently used idle pool of this size (lease these to stay warm)."""
        return tuple(self._ask("prefer", world_size, self.session)) if self._binds_devices else ()

    def pools_started(self) -> int:
        """Pools the server has started this session, for every worker together."""
        return int(self._ask("stats")["pools_started"])

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        self.last_start_s = 0.0
        return [pickle.loads(outcome) for outcome in self._ask(*self.run_request(task, devices, impl_spec))]

    def run_request(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> tuple[Any, ...]:
        """The request that runs ``task``: its call pickled here, for the server to forward unread."""
        return ("run", wire.dumps(task.pickled()), tuple(devices), impl_spec, list(sys.path), self._preload,
                self.session)

    def close(self) -> None:
        if self._releases:
            self._releases = False
            try:
                self._ask("release", self.session)
            except RankCrashed:
                pass  # the server is gone, and its pools with it
        if self._conn is not None:
            self._conn.close()
            self._conn = None
