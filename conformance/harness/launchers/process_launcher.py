"""The process launcher: warm rank pools, one per (world size, device set), the least recently used evicted.

Each pool (:mod:`conformance.harness.launchers.process_pool`) starts its ranks
from the launcher's one fork server (:mod:`conformance.harness.launchers.zygote_client`),
restarted when it died.
"""

from __future__ import annotations

import os
import socket
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from conformance.harness.case import RankOutcome, RankTask
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.process_pool import RankPool
from conformance.harness.launchers.zygote_client import Zygote


@dataclass(frozen=True)
class PoolKey:
    world_size: int
    devices: tuple[str, ...]


class ProcessLauncher:
    """Keeps one warm pool per (world size, device set), evicting the least recently used.

    ``max_live_ranks`` bounds how many idle rank processes this launcher keeps
    (each holds a torch runtime in memory).  ``fork_server=False`` starts every
    rank as a fresh interpreter instead of forking it from the zygote;
    ``preload`` names modules the zygote imports beyond its own list.
    """

    name = "process"

    def __init__(self, kind: DeviceKind, *, max_live_ranks: int = 16, num_threads: int = 1,
                 fork_server: bool = True, preload: Sequence[str] = ()) -> None:
        self.kind = kind
        self._preload = tuple(preload)
        self.max_live_ranks = max_live_ranks
        self._num_threads = num_threads
        self._fork_server = fork_server and hasattr(socket, "send_fds") and hasattr(os, "fork")
        self._zygote: Zygote | None = None
        self._pools: OrderedDict[PoolKey, RankPool] = OrderedDict()
        #: Seconds the last :meth:`run` spent starting ranks (0 when its pool was warm).
        self.last_start_s = 0.0

    def preferred_devices(self, world_size: int) -> tuple[str, ...]:
        """The devices of the warm pool of this size, if any (lease these to stay warm)."""
        for key in reversed(self._pools):
            if key.world_size == world_size:
                return key.devices
        return ()

    def _zygote_for_start(self) -> Zygote | None:
        if not self._fork_server:
            return None
        if self._zygote is None or not self._zygote.alive:
            if self._zygote is not None:
                self._zygote.close()
            self._zygote = Zygote(self._preload)
        return self._zygote

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        key = PoolKey(task.world_size, tuple(devices) if self.kind.binds_devices else ())
        pool = self._pools.pop(key, None)
        self.last_start_s = 0.0
        if pool is None:
            same_size = [k for k in self._pools if k.world_size == task.world_size]
            for stale in same_size:  # a device pool bound elsewhere is rebuilt on the new lease
                self._pools.pop(stale).close()
            self._evict(task.world_size)
            begun = time.perf_counter()
            pool = RankPool(task.world_size, self.kind, devices, num_threads=self._num_threads,
                            fork_server=self._zygote_for_start)
            self.last_start_s = time.perf_counter() - begun
        self._pools[key] = pool
        try:
            return pool.run(task, impl_spec, self.name)
        finally:
            self.last_start_s += pool.last_start_s
            self._evict(0)  # a pool larger than the budget is not kept warm

    def _evict(self, incoming: int) -> None:
        while self._pools and sum(k.world_size for k in self._pools) + incoming > self.max_live_ranks:
            _, pool = self._pools.popitem(last=False)
            pool.close()

    def close(self) -> None:
        while self._pools:
            self._pools.popitem()[1].close()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
