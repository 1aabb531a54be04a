"""The process launcher: warm rank pools, several per (world size, device set, session), the least recently used
evicted.

Each pool (:mod:`conformance.harness.launchers.process_pool`) starts its ranks
from the launcher's one fork server (:mod:`conformance.harness.launchers.zygote_client`),
restarted when it died.  A launcher is safe to share between threads: the
session's rank server (:mod:`conformance.harness.launchers.rank_server`) runs
the cases of every pytest-xdist worker through one launcher, each on its own
thread, so two cases of one world size run at once on two pools.  A rank
server shared by several sessions keeps each session's pools apart
(:class:`~conformance.harness.launchers.session_env.SessionEnv`): ranks never
serve two sessions, whose implementations and environments differ.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from conformance.harness.case import RankOutcome, RankTask
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.process_pool import RankPool
from conformance.harness.launchers.session_env import SessionEnv
from conformance.harness.launchers.zygote_client import ForkServer, Zygote

#: Seconds a pool that has run a case stays warm once no case uses it.  Idle ranks are not free: gloo's TCP loop
#: wakes every 10 ms in every process group, and a rank holding Megatron's parallel state has some twenty of them,
#: 20 ms of CPU a second per rank (measured: 2 ranks, 20 groups, 0.21 s of CPU over 10 s idle each).  Cases run
#: in order of world size, so a pool idle for this long has usually served its size for the session; a case of
#: its size later starts a fresh pool from the warm fork server.
RETIRE_IDLE_S = 5.0


@dataclass(frozen=True)
class PoolKey:
    world_size: int
    devices: tuple[str, ...]
    session: SessionEnv | None = None  #: the session whose environment its ranks have (None: this process's)


class ProcessLauncher:
    """Keeps warm pools per (world size, device set), evicting the least recently used idle one.

    ``max_live_ranks`` bounds how many rank processes this launcher keeps,
    idle and busy (each holds a torch runtime in memory); a busy pool is never
    evicted, so the leases' cap on running ranks is the only cap on those.
    ``fork_server=False`` starts every rank as a fresh interpreter instead of
    forking it from the zygote; ``preload`` names modules the zygote imports
    beyond its own list (:meth:`want_preloaded` adds more until it starts);
    ``zygote``: one started already (before this process imported torch, so
    that both import at once).  ``retire_idle_s``: how long a pool that ran
    a case stays warm unused (:data:`RETIRE_IDLE_S`; pools warmed ahead stay
    until their first case).
    """

    name = "process"
    relaunches = True

    def __init__(self, kind: DeviceKind, *, max_live_ranks: int = 16, num_threads: int = 1,
                 fork_server: bool = True, preload: Sequence[str] = (), zygote: Zygote | None = None,
                 retire_idle_s: float = RETIRE_IDLE_S) -> None:
        self.kind = kind
        self.retire_idle_s = retire_idle_s
        self.max_live_ranks = max_live_ranks
        self._num_threads = num_threads
        self._forks = ForkServer(fork_server, preload, zygote, threads=num_threads)
        self._lock = threading.Lock()
        self._idle: list[tuple[PoolKey, RankPool]] = []  # least recently used first
        self._busy: Counter[PoolKey] = Counter()  # pools running a case, by key
        #: Pools being started ahead of their first case (:meth:`warm`), and when each is done.
        self._warming: dict[PoolKey, threading.Event] = {}
        #: The threads warming each session's pools (one per session: its first list counts).
        self._warmers: dict[SessionEnv | None, threading.Thread] = {}
        #: Pools being closed, by id: their devices, and when their ranks have exited.
        self._closing: dict[int, tuple[frozenset[str], threading.Event]] = {}
        self._closed = False
        self._calls = threading.local()
        self._pools_started = 0

    def pools_started(self) -> int:
        """Pools started since the launcher was made (restarts after a hang or crash included)."""
        return self._pools_started

    @property
    def last_start_s(self) -> float:
        """Seconds this thread's last :meth:`run` spent starting ranks (0 when its pool was warm)."""
        return getattr(self._calls, "start_s", 0.0)

    def want_preloaded(self, names: Sequence[str], *, now: bool = False) -> None:
        """Have the fork server import ``names`` too: before it is ready, or, once told its modules, before its next
        fork.  ``now``: the list is complete, so a prestarted fork server is told it at once."""
        self._forks.want_preloaded(names, now=now)

    def preferred_devices(self, world_size: int, session: SessionEnv | None = None) -> tuple[str, ...]:
        """The devices of the most recently used idle pool of this size (and session), if any (lease these to stay
        warm)."""
        with self._lock:
            for key, _ in reversed(self._idle):
                if key.world_size == world_size and key.session == session:
                    return key.devices
        return ()

    def prestart(self) -> None:
        """Start the fork server now, so that it imports torch while the session collects its cases."""
        self._forks.prestart()

    def warm(self, world_sizes: Sequence[int], session: SessionEnv | None = None) -> None:
        """Start an idle pool of each of ``world_sizes`` (in that order, for ``session``) in the background, as soon
        as the fork server is ready; returns at once.

        The session names the sizes its cases need, first needed first, once
        it has collected them: the pools then start while the first cases
        run, and a case whose pool is still starting waits for it rather than
        starting another.  Only for ranks that bind no device (CPU slots): a
        device pool's devices are known only once leased.  Sizes beyond the
        slots or the live-rank budget are left to start when needed.  Only a
        session's first list counts (every worker of a session sends the same).
        """
        if self.kind.binds_devices:
            return
        sizes = [w for w in dict.fromkeys(world_sizes) if 0 < w <= len(self.kind.lease_names())]
        with self._lock:
            if not sizes or self._closed or session in self._warmers:
                return
            warmer = self._warmers[session] = threading.Thread(target=self._warm, args=(sizes, session),
                                                               name="warm-pools", daemon=True)
            warmer.start()

    def _warm(self, sizes: Sequence[int], session: SessionEnv | None) -> None:
        for size in sizes:
            key = PoolKey(size, (), session)
            with self._lock:
                if self._closed or self._live_ranks() + size > self.max_live_ranks:
                    return
                if key in self._warming or self._busy[key] or any(k == key for k, _ in self._idle):
                    continue  # a case started it already
                done = self._warming[key] = threading.Event()
            pool = RankPool(size, self.kind, (), num_threads=self._num_threads, fork_server=self._forks.for_start,
                            session=session)
            started = keep = False
            try:
                pool.start()
                started = True
            except Exception:  # noqa: BLE001 - the case that needs it starts its own and says why
                pass
            finally:
                with self._lock:
                    del self._warming[key]
                    keep = started and not self._closed
                    if keep:
                        self._idle.append((key, pool))
                        self._pools_started += 1
                done.set()
            if started and not keep:
                pool.close()

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str,
            sys_path: Sequence[str] | None = None, session: SessionEnv | None = None, *,
            raw: bool = False) -> list[RankOutcome]:
        """Run ``task`` on a warm pool of its size bound to ``devices`` (started if none is idle).

        ``sys_path``: where the ranks import the task from (default: this process's path); ``session``: the
        session whose ranks run it, where it is not this process's (its pools are its own); ``raw``: the
        outcomes as the ranks pickled them (:meth:`RankPool.run`).
        """
        key = PoolKey(task.world_size, tuple(devices) if self.kind.binds_devices else (), session)
        self._calls.start_s = 0.0
        pool = self._checkout(key)
        if pool is not None and task.fresh:  # ranks that ran cases before: retired for new ones
            pool.close()
            pool = None
        if pool is None:
            pool = RankPool(task.world_size, self.kind, devices, num_threads=self._num_threads,
                            fork_server=self._forks.for_start, session=session)
        try:
            return pool.run(task, impl_spec, self.name, sys_path, raw=raw)
        finally:
            self._calls.start_s += pool.last_start_s
            self._check_in(key, pool)

    def _checkout(self, key: PoolKey) -> RankPool | None:
        """An idle pool for ``key`` (the most recently used; one being warmed is waited for), or None; counts its
        ranks as busy either way.

        Where a device takes one rank process at a time (:attr:`DeviceKind.one_process_per_device`), a pool
        about to start first closes every idle pool holding one of its devices and waits until the ranks of
        every pool being closed there have exited.
        """
        while True:
            with self._lock:
                for i in range(len(self._idle) - 1, -1, -1):
                    if self._idle[i][0] == key:
                        self._busy[key] += 1
                        return self._idle.pop(i)[1]
                warming = self._warming.get(key)
                if warming is None:
                    self._busy[key] += 1
                    victims = self._evictions(key.devices if self.kind.one_process_per_device else ())
                    break
            begun = time.perf_counter()
            warming.wait()
            self._calls.start_s += time.perf_counter() - begun  # its start, as far as this case waited for it
        self._close_evicted(victims)
        if self.kind.one_process_per_device:
            with self._lock:
                leaving = [done for devices, done in self._closing.values() if devices.intersection(key.devices)]
            for done in leaving:
                done.wait()
        return None

    def _check_in(self, key: PoolKey, pool: RankPool) -> None:
        with self._lock:
            self._pools_started += bool(pool.last_start_s)
            self._busy[key] -= 1
            if pool.alive:  # a pool that hung or crashed closed itself
                pool.idle_since = time.monotonic()
                self._idle.append((key, pool))
            victims = self._evictions()  # a pool larger than the budget is not kept warm
        self._close_evicted(victims)

    def _evictions(self, devices: Sequence[str] = ()) -> list[RankPool]:
        """Idle pools to close (under the lock), each marked closing: those holding any of ``devices``, those
        unused for :attr:`retire_idle_s` since their last case, then the least recently used until idle and
        busy ranks fit the budget."""
        now = time.monotonic()
        wanted = set(devices)
        victims = [p for k, p in self._idle if wanted.intersection(k.devices)
                   or p.idle_since is not None and now - p.idle_since > self.retire_idle_s]
        self._idle = [(k, p) for k, p in self._idle if all(p is not v for v in victims)]
        while self._idle and self._live_ranks() > self.max_live_ranks:
            victims.append(self._idle.pop(0)[1])
        for victim in victims:
            self._closing[id(victim)] = (frozenset(victim.devices), threading.Event())
        return victims

    def _close_evicted(self, victims: Sequence[RankPool]) -> None:
        """Close pools marked closing (:meth:`_evictions`, :meth:`release`); once their ranks have exited,
        their devices are free."""
        try:
            _stop_all(victims)
        finally:
            with self._lock:
                for victim in victims:
                    self._closing.pop(id(victim))[1].set()

    def _live_ranks(self) -> int:
        """Ranks of idle, busy and warming pools (under the lock)."""
        return (sum(k.world_size for k, _ in self._idle) + sum(k.world_size * n for k, n in self._busy.items())
                + sum(k.world_size for k in self._warming))

    def release(self, session: SessionEnv) -> None:
        """Close the idle pools of a session that has ended (a shared rank server's client)."""
        with self._lock:
            ended = [pool for key, pool in self._idle if key.session == session]
            self._idle = [(key, pool) for key, pool in self._idle if key.session != session]
            self._warmers.pop(session, None)
            for pool in ended:
                self._closing[id(pool)] = (frozenset(pool.devices), threading.Event())
        self._close_evicted(ended)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._forks.refuse()  # a pool still warming when the session ended starts no rank
            idle, self._idle = self._idle, []
            warmers = list(self._warmers.values())
        _stop_all([pool for _, pool in idle])
        self._forks.close()  # its ranks die with it, so a pool still starting fails at once
        for warmer in warmers:
            warmer.join(timeout=30)


def _stop_all(pools: Sequence[RankPool]) -> None:
    """Every pool's ranks leave at once, then each pool is reaped."""
    for pool in pools:
        pool.ask_to_stop()
    for pool in pools:
        pool.close()
