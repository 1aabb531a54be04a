"""A rank's CPU time, read from ``/proc`` per process or per thread: who progressed over a span, rank by rank.

A rank's *task thread* is read, not the whole process: gloo keeps one TCP
loop thread per process group, ~0.8 ms of CPU a second each, and Megatron's
set-up makes 20 or more groups, so a process blocked in a collective used
16 ms a second -- above the line (``docs/DESIGN.md#progress-evidence``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The share of one core a rank's task thread must use over a window to count as progressing: measured
#: here, a rank blocked in a gloo all-reduce used 1-2.2 ms per second, while ranks of a correct case beside CPU hogs
#: and two busy pytest workers on 2 cores got 16-70 ms per second (taking turns at every all-reduce).
BUSY_SHARE = 0.008
#: ... and never less than this many CPU seconds (above the accounting's resolution).
MIN_CPU_S = 0.003


def cpu_seconds(pid: int, tids: Sequence[int] | None = None) -> float | None:
    """CPU seconds a process (or the given threads of it) has used; None where ``/proc`` cannot say.

    Summed over the threads' scheduler statistics (nanoseconds); without them,
    the process's ``utime + stime`` (clock ticks, exited threads included).
    """
    task_dir = f"/proc/{pid}/task"
    try:
        threads = [str(t) for t in tids] if tids is not None else os.listdir(task_dir)
    except OSError:
        return None
    total, read = 0, False
    for tid in threads:
        try:
            with open(f"{task_dir}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
            read = True
        except (OSError, ValueError, IndexError):
            continue
    if read:
        return total / 1e9
    if tids is not None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Rank:
    """Where a rank's CPU time is read: its process and its task thread (the process's main thread: ``tid=pid``)."""

    pid: int
    tid: int | None = None

    def cpu(self) -> float | None:
        return cpu_seconds(self.pid, None if self.tid is None else [self.tid])


class ProgressWatch:
    """Each rank's CPU time since the last :meth:`mark`: who progressed over that span, rank by rank."""

    def __init__(self, ranks: Mapping[int, Rank]) -> None:
        self.ranks = dict(ranks)
        self._since = time.monotonic()
        self._cpu: dict[int, float | None] = {}
        self.mark()

    @property
    def available(self) -> bool:
        """Whether CPU time can be read for every rank (else there is no evidence either way)."""
        return bool(self.ranks) and all(v is not None for v in self._cpu.values())

    def mark(self, ranks: Sequence[int] | None = None) -> None:
        """Start a new span now, for ``ranks`` (all when None)."""
        self._since = time.monotonic()
        for r in self.ranks if ranks is None else ranks:
            if r in self.ranks:
                self._cpu[r] = self.ranks[r].cpu()

    def span(self) -> float:
        """Seconds since the last :meth:`mark`."""
        return time.monotonic() - self._since

    def readings(self) -> tuple[float, dict[int, float | None]]:
        """When, and each rank's CPU seconds then: a mark to measure from later (:meth:`used`, :meth:`progressed`)."""
        return time.monotonic(), {r: rank.cpu() for r, rank in self.ranks.items()}

    def used(self, ranks: Sequence[int], since: tuple[float, dict[int, float | None]] | None = None,
             helpers: Mapping[int, float] | None = None) -> dict[int, float]:
        """CPU seconds each of ``ranks`` used since ``since`` (or the last :meth:`mark`; unreadable ones left out),
        with what its helper threads used meanwhile (``helpers``, reported by the rank)."""
        before_all = self._cpu if since is None else since[1]
        used = {}
        for r in ranks:
            before, now = before_all.get(r), self.ranks[r].cpu() if r in self.ranks else None
            if before is not None and now is not None:
                used[r] = now - before + (helpers or {}).get(r, 0.0)
        return used

    def progressed(self, ranks: Sequence[int], since: tuple[float, dict[int, float | None]] | None = None,
                   helpers: Mapping[int, float] | None = None) -> list[int]:
        """Those of ``ranks`` that used at least :data:`BUSY_SHARE` of a core since ``since`` (or the last mark),
        their helper threads' CPU time (``helpers``) included."""
        span = self.span() if since is None else time.monotonic() - since[0]
        floor = max(MIN_CPU_S, BUSY_SHARE * span)
        return sorted(r for r, s in self.used(ranks, since, helpers).items() if s >= floor)
