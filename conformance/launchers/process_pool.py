"""Warm pools of rank processes (gloo on CPU, nccl / hccl on devices).

Spawning and initialising W ranks costs seconds; a pool does it once per world
size and then runs each case in milliseconds.  A case that hangs or kills a
rank fails within its timeout with every rank's Python stack attached; the pool
is then torn down and rebuilt on next use, so the session goes on.
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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import NoReturn

from conformance.case import Case, RankOutcome
from conformance.errors import CaseTimeout, RankCrashed
from conformance.launchers.devices import DeviceKind
from conformance.launchers.worker import STOP

#: How long ranks get to dump their stacks after SIGUSR1.
_STACK_GRACE_S = 0.5


@dataclass(frozen=True)
class PoolKey:
    world_size: int
    devices: tuple[str, ...]


class RankPool:
    """``world_size`` live rank processes sharing one process group."""

    def __init__(
        self, world_size: int, kind: DeviceKind, devices: Sequence[str], *,
        start_timeout_s: float = 180.0, num_threads: int = 1,
    ) -> None:
        self.world_size = world_size
        self.kind = kind
        self.devices = tuple(devices)
        self._start_timeout_s = start_timeout_s
        self._num_threads = num_threads
        self._procs: list[subprocess.Popen[bytes]] = []
        self._conns: list[Connection] = []
        self._tmp: Path | None = None

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs)

    def start(self) -> None:
        """Launch the ranks as fresh interpreters and wait until each has joined the group.

        Ranks are started with ``python -m`` rather than multiprocessing's spawn,
        which would re-import the parent's ``__main__`` (pytest, an xdist worker).
        Each rank talks to the pool over its own socket pair.
        """
        self._tmp = Path(tempfile.mkdtemp(prefix=f"coc-pool-w{self.world_size}-"))
        env = {**os.environ, **self.kind.visible_devices_env(self.devices)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        for rank in range(self.world_size):
            ours, theirs = socket.socketpair()
            spec = {
                "rank": rank,
                "world_size": self.world_size,
                "fd": theirs.fileno(),
                "store_path": str(self._tmp / "store"),
                "backend": self.kind.backend,
                "device": self.kind.rank_device(rank),
                "stack_path": str(self._stack_path(rank)),
                "collective_timeout_s": max(self._start_timeout_s, 300.0),
                "num_threads": self._num_threads,
            }
            with open(self._log_path(rank), "wb") as log:
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "conformance.launchers.worker", json.dumps(spec)],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                ))
            theirs.close()
            self._conns.append(Connection(ours.detach()))
        deadline = time.monotonic() + self._start_timeout_s
        waiting = set(range(self.world_size))
        while waiting:
            dead = [r for r, p in enumerate(self._procs) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                stacks = self._dump_stacks()
                self.close(kill=True)
                why = f"rank(s) {dead} exited" if dead else f"not ready within {self._start_timeout_s:.0f} s"
                raise RankCrashed(f"rank pool of {self.world_size} failed to start: {why}", stacks=stacks)
            for conn in wait([self._conns[r] for r in waiting], timeout=0.2):
                conn.recv_bytes()  # "ready": the process group is initialised
                waiting.discard(self._conns.index(conn))  # type: ignore[arg-type]

    def run(self, case: Case, impl_spec: str, launcher: str) -> list[RankOutcome]:
        """Run ``case`` on every rank; raise on hang or crash (the pool is then closed)."""
        if not self.alive:
            self.close(kill=True)
            self.start()
        message = pickle.dumps(
            (list(sys.path), pickle.dumps((case.fn, case.params)), impl_spec, launcher)
        )
        offsets = [self._file_size(self._stack_path(r)) for r in range(self.world_size)]
        log_offsets = [self._file_size(self._log_path(r)) for r in range(self.world_size)]
        for conn in self._conns:
            conn.send_bytes(message)
        outcomes: dict[int, RankOutcome] = {}
        pending = dict(enumerate(self._conns))
        deadline = time.monotonic() + case.timeout
        while pending:
            # Exits are noticed through the socket: a dead rank's end reads EOF.
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            for conn in ready:
                rank = self._conns.index(conn)  # type: ignore[arg-type]
                try:
                    outcomes[rank] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._procs[rank].wait(timeout=5)
                    self._fail(RankCrashed, case, f"rank {rank} died (exit code "
                               f"{self._procs[rank].returncode})", outcomes, offsets, log_offsets)
                del pending[rank]
            if pending and time.monotonic() >= deadline:
                self._fail(CaseTimeout, case, f"rank(s) {sorted(pending)} did not finish within "
                           f"{case.timeout:g} s", outcomes, offsets, log_offsets)
        return [outcomes[rank] for rank in range(self.world_size)]

    def _fail(self, error: type[CaseTimeout] | type[RankCrashed], case: Case, why: str,
              outcomes: dict[int, RankOutcome], offsets: Sequence[int],
              log_offsets: Sequence[int]) -> NoReturn:
        stacks = self._dump_stacks(offsets)
        for rank, start in enumerate(log_offsets):
            output = self._read_from(self._log_path(rank), start)
            if output:
                stacks[rank] += f"\n--- rank {rank} process output ---\n{output}"
        self.close(kill=True)
        finished = [o for _, o in sorted(outcomes.items())]
        raised = [o.rank for o in finished if o.error is not None]
        note = f"; rank(s) {raised} raised" if raised else ""
        raise error(f"{case.name}: {why}{note}", stacks=stacks, outcomes=finished)

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
            if proc.poll() is None:
                proc.send_signal(signal.SIGUSR1)
                signalled.append(rank)
        time.sleep(_STACK_GRACE_S if signalled else 0)
        stacks = {}
        for rank, proc in enumerate(self._procs):
            text = self._read_from(self._stack_path(rank), offsets[rank])
            if rank not in signalled:
                text = f"(process exited with code {proc.returncode})\n{text}".strip()
            stacks[rank] = text or "(no stack captured)"
        return stacks

    def close(self, *, kill: bool = False) -> None:
        """Stop the ranks (politely unless ``kill``) and remove the pool's files."""
        for conn, proc in zip(self._conns, self._procs):
            if not kill and proc.poll() is None:
                try:
                    conn.send_bytes(STOP)
                except OSError:
                    pass
        for proc in self._procs:
            if kill:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


class ProcessLauncher:
    """Keeps one warm pool per (world size, device set), evicting the least recently used.

    ``max_live_ranks`` bounds how many idle rank processes this launcher keeps
    (each holds a torch runtime in memory).
    """

    name = "process"

    def __init__(self, kind: DeviceKind, *, max_live_ranks: int = 16, num_threads: int = 1) -> None:
        self.kind = kind
        self.max_live_ranks = max_live_ranks
        self._num_threads = num_threads
        self._pools: OrderedDict[PoolKey, RankPool] = OrderedDict()

    def preferred_devices(self, world_size: int) -> tuple[str, ...]:
        """The devices of the warm pool of this size, if any (lease these to stay warm)."""
        for key in reversed(self._pools):
            if key.world_size == world_size:
                return key.devices
        return ()

    def run(self, case: Case, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        key = PoolKey(case.world_size, tuple(devices) if self.kind.binds_devices else ())
        pool = self._pools.pop(key, None)
        if pool is None:
            same_size = [k for k in self._pools if k.world_size == case.world_size]
            for stale in same_size:  # a device pool bound elsewhere is rebuilt on the new lease
                self._pools.pop(stale).close()
            self._evict(case.world_size)
            pool = RankPool(case.world_size, self.kind, devices, num_threads=self._num_threads)
        self._pools[key] = pool
        try:
            return pool.run(case, impl_spec, self.name)
        finally:
            self._evict(0)  # a pool larger than the budget is not kept warm

    def _evict(self, incoming: int) -> None:
        while self._pools and sum(k.world_size for k in self._pools) + incoming > self.max_live_ranks:
            _, pool = self._pools.popitem(last=False)
            pool.close()

    def close(self) -> None:
        while self._pools:
            self._pools.popitem()[1].close()
