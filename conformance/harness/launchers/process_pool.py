"""A warm pool of rank processes of one world size (gloo on CPU, nccl / hccl on devices).

Starting and initialising W ranks costs seconds; a pool does it once and then
runs each task in milliseconds.  Ranks are forked from the launcher's fork
server (:mod:`conformance.harness.launchers.zygote_client`), which has torch
and megatron imported already, so even a rebuild after a hang costs well under
a second per rank.

A task that hangs or kills a rank fails with every rank's Python stack
attached; the pool is then torn down and rebuilt on next use, so the session
goes on.  Each rank loads the implementation before it runs the task and says
so; a task may lower its deadline while it runs
(:meth:`~conformance.harness.case.RankContext.expect_within`): a rank sends
the new budget, and its own evidence of progress (collectives completed, its
stack changing, device work completing, whether it waits in a collective), and
:class:`~conformance.harness.case_clock.CaseClock` decides, rank by rank, when
the case has hung (``docs/DESIGN.md#progress-evidence``).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NoReturn, cast

from conformance.harness import wire
from conformance.harness.case import RankOutcome, RankTask
from conformance.harness.case_clock import CaseClock
from conformance.harness.case_errors import CaseTimeout, RankCrashed
from conformance.harness.cpu_time import ProgressWatch, Rank
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.rank_process import RankProcess
from conformance.harness.launchers.session_env import SessionEnv
from conformance.harness.launchers.worker import BUDGET, LOADED, PROGRESS, READY, STOP
from conformance.harness.launchers.zygote_client import Zygote
from conformance.harness.progress import Evidence

#: How long ranks get to dump their stacks after SIGUSR1.
_STACK_GRACE_S = 0.5


class RankPool:
    """``world_size`` live rank processes sharing one process group."""

    def __init__(
        self, world_size: int, kind: DeviceKind, devices: Sequence[str], *,
        start_timeout_s: float = 180.0, num_threads: int = 1,
        fork_server: Callable[[], Zygote | None] = lambda: None, session: SessionEnv | None = None,
    ) -> None:
        self.world_size = world_size
        self.kind = kind
        self.devices = tuple(devices)
        self._start_timeout_s = start_timeout_s
        self._num_threads = num_threads
        #: The fork server to start ranks from, asked at each (re)start (None: fresh interpreters).
        self._fork_server = fork_server
        #: The environment and working directory its ranks take on (None: the launching process's).
        self.session = session
        self._procs: list[RankProcess] = []
        self._conns: list[Connection] = []
        self._tmp: Path | None = None
        self._stopping = False
        #: Seconds the last :meth:`run` spent starting the ranks (0 when they were warm).
        self.last_start_s = 0.0
        #: Since when (monotonic) the pool has been idle after its last case (None: it has run none).
        self.idle_since: float | None = None

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.alive() for p in self._procs)

    def start(self) -> None:
        """Start the ranks and wait until each has joined the process group.

        Each rank talks to the pool over its own socket pair.  A rank that dies
        while starting fails the start with every rank's stack and output
        (the others are killed).
        """
        self._tmp = Path(tempfile.mkdtemp(prefix=f"coc-pool-w{self.world_size}-"))
        env = dict(self.kind.visible_devices_env(self.devices))
        zygote = self._fork_server()
        for rank in range(self.world_size):
            ours, theirs = socket.socketpair()
            spec = {
                "rank": rank,
                "world_size": self.world_size,
                "store_path": str(self._tmp / "store"),
                "backend": self.kind.backend,
                "device": self.kind.rank_device(rank, self.devices),
                "stack_path": str(self._stack_path(rank)),
                "collective_timeout_s": max(self._start_timeout_s, 300.0),
                "num_threads": self._num_threads,
            }
            log = self._log_path(rank)
            log.touch()
            session = self.session
            if zygote is not None:
                self._procs.append(RankProcess(zygote.fork(spec, env, log, theirs.fileno(), session), log))
            else:
                base = dict(session.variables) if session is not None else {
                    **os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
                with open(log, "wb") as out:
                    popen = subprocess.Popen(
                        [sys.executable, "-m", "conformance.harness.launchers.worker",
                         json.dumps({**spec, "fd": theirs.fileno()})],
                        env={**base, **env}, cwd=session.cwd if session is not None else None,
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        pass_fds=(theirs.fileno(),),
                    )
                self._procs.append(RankProcess(popen.pid, log, popen))
            theirs.close()
            self._conns.append(Connection(ours.detach()))
        deadline = time.monotonic() + self._start_timeout_s
        waiting = set(range(self.world_size))
        while waiting:
            dead = [r for r, p in enumerate(self._procs) if not p.alive()]
            if dead or time.monotonic() > deadline:
                self._fail_start(dead)
            for ready in wait([self._conns[r] for r in waiting], timeout=0.2):
                conn = cast(Connection, ready)
                rank = self._conns.index(conn)
                try:
                    message = conn.recv_bytes()
                except (EOFError, OSError):
                    self._fail_start([rank])
                if message == READY:  # the process group is initialised
                    waiting.discard(rank)

    def _fail_start(self, dead: Sequence[int]) -> NoReturn:
        codes = {r: self._procs[r].exit_code() for r in dead}
        stacks = self._dump_stacks()
        self._add_output(stacks, [0] * self.world_size)
        self.close(kill=True)
        why = (f"rank(s) {sorted(dead)} exited (exit codes {codes})" if dead
               else f"not ready within {self._start_timeout_s:.0f} s")
        raise RankCrashed(f"rank pool of {self.world_size} failed to start: {why}", stacks=stacks)

    def run(self, task: RankTask, impl_spec: str, launcher: str,
            sys_path: Sequence[str] | None = None, *, raw: bool = False) -> list[Any]:
        """Run ``task`` on every rank; raise on hang or crash (the pool is then closed).

        ``sys_path``: the import path the ranks add before loading the task (default: this process's).
        ``raw``: return each rank's outcome as the rank pickled it (a rank server forwards it unread).
        """
        self.last_start_s = 0.0
        if not self.alive:
            self.close(kill=True)
            begun = time.perf_counter()
            self.start()
            self.last_start_s = time.perf_counter() - begun
        message = pickle.dumps(
            (list(sys.path if sys_path is None else sys_path), task.pickled_call(), impl_spec,
             launcher, task.budget, task.device_thread_backward)
        )
        offsets = [self._file_size(self._stack_path(r)) for r in range(self.world_size)]
        log_offsets = [self._file_size(self._log_path(r)) for r in range(self.world_size)]
        for conn in self._conns:
            conn.send_bytes(message)
        outcomes: dict[int, bytes] = {}
        pending = dict(enumerate(self._conns))
        clock = CaseClock(task.timeout, self._progress_watch(), loading=pending)
        while pending:
            # Exits are noticed through the socket: a dead rank's end reads EOF.
            for ready in wait(list(pending.values()), timeout=clock.left()):
                conn = cast(Connection, ready)
                rank = self._conns.index(conn)
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    code = self._procs[rank].exit_code(wait_s=5)
                    self._fail(RankCrashed, task, f"rank {rank} died (exit code {code})",
                               outcomes, offsets, log_offsets)
                if data[:1] == LOADED:
                    clock.loaded(rank)
                elif data[:1] == BUDGET:
                    clock.budget(float(data[1:]), rank)
                elif data[:1] == PROGRESS:
                    clock.report(rank, Evidence(**json.loads(data[1:])))
                else:
                    outcomes[rank] = data[1:]
                    del pending[rank]
            why = clock.hung(pending) if pending else None
            if why:
                self._fail(CaseTimeout, task, why, outcomes, offsets, log_offsets)
        return [outcomes[rank] if raw else wire.loads(outcomes[rank]) for rank in range(self.world_size)]

    def _progress_watch(self) -> ProgressWatch | None:
        """CPU time of each rank's task thread (its main thread); none on devices, where a rank waiting spins (the
        emulated NPU node's device work is its host's: CPU time is evidence there)."""
        if not self.kind.computes_on_host:
            return None
        return ProgressWatch({rank: Rank(proc.pid, proc.pid) for rank, proc in enumerate(self._procs)})

    def _fail(self, error: type[CaseTimeout] | type[RankCrashed], task: RankTask, why: str,
              outcomes: dict[int, bytes], offsets: Sequence[int],
              log_offsets: Sequence[int]) -> NoReturn:
        stacks = self._dump_stacks(offsets)
        self._add_output(stacks, log_offsets)
        self.close(kill=True)
        finished: list[RankOutcome] = [wire.loads(o) for _, o in sorted(outcomes.items())]
        raised = [o.rank for o in finished if o.error is not None]
        note = f"; rank(s) {raised} raised" if raised else ""
        raise error(f"{task.name}: {why}{note}", stacks=stacks, outcomes=finished)

    def _add_output(self, stacks: dict[int, str], log_offsets: Sequence[int]) -> None:
        for rank, start in enumerate(log_offsets):
            output = self._read_from(self._log_path(rank), start)
            if output:
                stacks[rank] = stacks.get(rank, "") + f"\n--- rank {rank} process output ---\n{output}"

    def _stack_path(self, rank: int) -> Path:
        assert self._tmp is not None
        return self._tmp / f"stack-{rank}.txt"

    def _log_path(self, rank: int) -> Path:
        assert self._tmp is not None
        return self._tmp / f"output-{rank}.txt"

    @staticmethod
    def _file_size(path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError:
            return 0

    @staticmethod
    def _read_from(path: Path, offset: int) -> str:
        try:
            with open(path, errors="replace") as f:
                f.seek(offset)
                return f.read().strip()
        except OSError:
            return ""

    def _dump_stacks(self, offsets: Sequence[int] | None = None) -> dict[int, str]:
        """Every rank's Python stacks (all threads), via faulthandler on SIGUSR1."""
        offsets = offsets or [0] * len(self._procs)
        signalled = []
        for rank, proc in enumerate(self._procs):
            if proc.alive():
                proc.signal(signal.SIGUSR1)
                signalled.append(rank)
        time.sleep(_STACK_GRACE_S if signalled else 0)
        stacks = {}
        for rank, proc in enumerate(self._procs):
            text = self._read_from(self._stack_path(rank), offsets[rank])
            if rank not in signalled:
                text = f"(process exited with code {proc.exit_code(wait_s=0.5)})\n{text}".strip()
            stacks[rank] = text or "(no stack captured)"
        return stacks

    def ask_to_stop(self) -> None:
        """Tell every rank to leave its loop, without waiting (:meth:`close` then waits for them)."""
        for conn, proc in zip(self._conns, self._procs):
            if not self._stopping and proc.alive():
                try:
                    conn.send_bytes(STOP)
                except OSError:
                    pass
        self._stopping = True

    def close(self, *, kill: bool = False) -> None:
        """Stop the ranks (politely unless ``kill``) and remove the pool's files."""
        if not kill:
            self.ask_to_stop()
        self._stopping = False
        for proc in self._procs:
            if kill:
                proc.signal(signal.SIGKILL)
            proc.reap(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
