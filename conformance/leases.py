"""Device leases shared by every pytest-xdist worker on a node.

A case needing N devices holds N distinct device locks (one lock file per
device in a directory all workers share) for as long as it runs; an exclusive
case (perf) holds all of them.  Locks are taken without blocking and released
all together when a full set is not available, so two workers can never
deadlock holding halves of each other's sets.  On CPU the "devices" are slots:
leasing them caps how many ranks run at once, so ``-n 8`` never oversubscribes.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from filelock import FileLock, Timeout


class LeaseTimeout(TimeoutError):
    """No full set of devices became free in time."""


def default_lease_dir() -> Path:
    """One directory per user and machine, so all workers of a session meet there."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"coc-conformance-leases-{uid}"


class DeviceLeases:
    """Lease distinct devices out of ``devices`` through lock files in ``lease_dir``."""

    def __init__(self, lease_dir: Path, devices: Sequence[str], *, wait_s: float = 1800.0) -> None:
        self.lease_dir = Path(lease_dir)
        self.lease_dir.mkdir(parents=True, exist_ok=True)
        self.devices = tuple(devices)
        self.wait_s = wait_s

    def _lock(self, device: str) -> FileLock:
        return FileLock(str(self.lease_dir / f"device-{device}.lock"))

    @contextlib.contextmanager
    def lease(
        self, count: int, *, exclusive: bool = False, prefer: Sequence[str] = ()
    ) -> Iterator[tuple[str, ...]]:
        """Hold ``count`` distinct devices (all of them if ``exclusive``).

        Devices in ``prefer`` are tried first, so a warm pool bound to them
        can be reused.  Yields the leased device names in lease order.
        """
        wanted = len(self.devices) if exclusive else count
        if wanted > len(self.devices):
            raise LeaseTimeout(
                f"a case needs {wanted} devices but this node has {len(self.devices)} "
                f"({', '.join(self.devices)})"
            )
        order = [d for d in prefer if d in self.devices]
        order += [d for d in self.devices if d not in order]
        deadline = time.monotonic() + self.wait_s
        delay = 0.005
        while True:
            held = self._try_take(order, wanted)
            if held is not None:
                break
            if time.monotonic() > deadline:
                raise LeaseTimeout(f"no {wanted} free devices within {self.wait_s:g} s")
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.2)
        try:
            yield tuple(name for name, _ in held)
        finally:
            for _, lock in held:
                lock.release()

    def _try_take(self, order: Sequence[str], wanted: int) -> list[tuple[str, FileLock]] | None:
        held: list[tuple[str, FileLock]] = []
        for name in order:
            lock = self._lock(name)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            held.append((name, lock))
            if len(held) == wanted:
                return held
        for _, lock in held:
            lock.release()
        return None
