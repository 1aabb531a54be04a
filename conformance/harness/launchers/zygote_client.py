"""The launcher's side of the rank fork server (:mod:`conformance.harness.launchers.zygote`).

One per launcher (:class:`ForkServer`), started early (:meth:`ProcessLauncher.prestart
<conformance.harness.launchers.process_launcher.ProcessLauncher.prestart>`)
or on first use, and again when it died: it starts the server process, names
the modules it should import beyond torch, waits until it has, and asks it
for a forked rank per request.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from conformance.harness.case_errors import RankCrashed
from conformance.harness.launchers.session_env import SessionEnv
from conformance.harness.launchers.subprocesses import end_process


def can_fork_ranks() -> bool:
    """Whether this platform can run the fork server (it passes descriptors over a Unix socket, and forks)."""
    return hasattr(socket, "send_fds") and hasattr(os, "fork")


class Zygote:
    """The launcher side of the fork server (one per launcher).

    Made, it starts the server, which imports torch at once; :meth:`begin`
    names the further modules it should import, :meth:`ready` waits until it
    has.  Modules named after that (by :meth:`ready`) are imported before the
    next fork.
    """

    def __init__(self, start_timeout_s: float = 180.0, threads: int = 1) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # A rank computes on ``threads`` threads (``torch.set_num_threads`` on its main thread), but OpenMP sizes every
        # other thread's team (the device thread a backward runs on) by OMP_NUM_THREADS, read once as torch is
        # imported, here: unset, each rank's teams took a thread per core and spun (the whole suite's ranks spent
        # 1.9x the CPU on 2 cores).  Set by the user, it is theirs.
        env.setdefault("OMP_NUM_THREADS", str(threads))
        # Its imports' warnings go to a log, not into the output of whichever test started it.
        self._log = tempfile.NamedTemporaryFile(prefix="coc-zygote-", suffix=".log", delete=False)  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "conformance.harness.launchers.zygote", str(theirs.fileno())],
            env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._sock = ours
        self._reader = self._sock.makefile("rb")
        self._start_timeout_s = start_timeout_s
        self._named = self._ready = False
        self._imported: set[str] = set()  #: the modules named to it so far
        self._wanted: list[str] = []  #: modules named since, imported before the next fork
        self._lock = threading.Lock()  # pools of several threads may start ranks at once
        #: Naming the modules never waits for the imports: a session's second worker names them (at the end of
        #: its collection) while a pool of the first waits in :meth:`ready` for the imports to finish.
        self._naming = threading.Lock()

    def begin(self, preload: Sequence[str] = ()) -> None:
        """Name the modules it should import beyond torch (only the first call counts); returns at once."""
        with self._naming:
            if self._named:
                return
            self._named = True
            self._imported.update(preload)  # before any ready() reads it: each calls begin() first
            try:
                self._sock.sendall((",".join(preload) + "\n").encode())
            except OSError:
                pass  # it died: ready() says so

    def ready(self, preload: Sequence[str] = ()) -> None:
        """:meth:`begin` with ``preload`` unless begun (else import the modules of it not named yet before the next
        fork), then wait until it can fork (at once once it could)."""
        self.begin(preload)
        with self._lock:
            self._wanted += [n for n in preload if n not in self._imported and n not in self._wanted]
            if self._ready:
                return
            self._sock.settimeout(self._start_timeout_s)
            try:
                ready = self._reader.readline().strip()
            except OSError:
                ready = b""
            if ready != b"ready":
                self._proc.kill()
                self._proc.wait()
                output = Path(self._log.name).read_text(errors="replace")[-4000:]
                raise RankCrashed(f"the rank fork server did not start (exit code {self._proc.poll()}):\n{output}")
            self._sock.settimeout(60)
            self._ready = True

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def fork(self, spec: dict[str, object], env: dict[str, str], log: Path, fd: int,
             session: SessionEnv | None = None) -> int:
        """A rank forked with ``spec`` and ``env`` (on top of ``session``'s environment, when given): its pid."""
        self.ready()
        with self._lock:
            wanted, self._wanted = self._wanted, []
            self._imported.update(wanted)
            request = json.dumps({
                "spec": spec, "env": env, "log": str(log), "preload": wanted,
                "session": None if session is None else {"variables": dict(session.variables), "cwd": session.cwd},
            }).encode()
            socket.send_fds(self._sock, [request], [fd])
            pid = self._reader.readline().strip()
        if not pid:
            raise RankCrashed(f"the rank fork server exited (exit code {self._proc.poll()}):\n"
                              f"{Path(self._log.name).read_text(errors='replace')[-4000:]}")
        return int(pid)

    def close(self) -> None:
        self._reader.close()
        self._sock.close()
        end_process(self._proc, grace_s=10)
        self._log.close()
        os.unlink(self._log.name)


class ForkServer:
    """A launcher's one fork server (:class:`Zygote`): started ahead (:meth:`prestart`) or by the first pool that
    starts ranks, restarted when it died, told every module to import ahead (the list only grows).

    ``enabled=False`` (or a platform that cannot fork ranks): every rank is a fresh interpreter.  ``zygote``:
    one started already.
    """

    def __init__(self, enabled: bool = True, preload: Sequence[str] = (), zygote: Zygote | None = None,
                 threads: int = 1) -> None:
        self.enabled = enabled and can_fork_ranks()
        self._threads = threads
        self._preload = tuple(preload)
        self._zygote = zygote if self.enabled else None
        self._refused = False
        self._lock = threading.Lock()

    def want_preloaded(self, names: Sequence[str], *, now: bool = False) -> None:
        """Import ``names`` too: before the server is ready, or, once told its modules, before its next fork.
        ``now``: the list is complete, so a prestarted server is told it at once."""
        with self._lock:
            self._preload += tuple(n for n in names if n not in self._preload)
            zygote = self._zygote if now else None
        if zygote is not None:
            zygote.begin(self._preload)

    def prestart(self) -> None:
        """Start the server now, so that it imports torch meanwhile."""
        with self._lock:
            if self.enabled and self._zygote is None:
                self._zygote = Zygote(threads=self._threads)

    def for_start(self) -> Zygote | None:
        """The server to fork a pool's ranks from, ready (started anew if it died); None: start interpreters."""
        if not self.enabled:
            return None
        with self._lock:
            if self._refused:  # a pool still warming when the session ended
                raise RankCrashed("the launcher is closed: no rank is started any more")
            if self._zygote is None or not self._zygote.alive:
                if self._zygote is not None:
                    self._zygote.close()
                self._zygote = Zygote(threads=self._threads)
            zygote = self._zygote
            preload = self._preload
        zygote.ready(preload)
        return zygote

    def refuse(self) -> None:
        """From now on :meth:`for_start` raises (the launcher is closing)."""
        with self._lock:
            self._refused = True

    def close(self) -> None:
        """Stop the server (the ranks it forked die with it)."""
        with self._lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None
