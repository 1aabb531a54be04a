"""A discrete-event simulation of cases run by xdist workers on a node's slots under the suite's lease rule.

Which worker gets which case is xdist's ``load`` scheduling
(:class:`LoadScheduling`); which waiting request gets slots is the one lease
rule, :func:`conformance.harness.leases.next_grant`.  ``python -m
conformance.bench schedule`` replays recorded runs through it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conformance.bench.recorded_run import Case
from conformance.harness import leases


@dataclass(frozen=True)
class Run:
    """One simulated case: its worker, when it started, asked for its lease, got it and ended."""

    id: str
    worker: int
    start: float
    asked: float
    granted: float
    end: float

    @property
    def lease_wait(self) -> float:
        return self.granted - self.asked


@dataclass(frozen=True)
class Schedule:
    """A simulated run of some cases on ``slots`` slots with ``workers`` workers (seconds)."""

    slots: int
    workers: int
    pool_start: float  #: the one-time pool start, in the makespan and the bound
    runs: tuple[Run, ...]  #: in order of ending
    unschedulable: tuple[str, ...]  #: cases needing more slots than the node has (not simulated)
    slot_seconds: float  #: Σ world × rank time of the simulated cases
    held_slot_seconds: float  #: Σ slots held × rank time: an exclusive case holds every slot
    longest_case: float  #: the longest single case's rank + worker time
    makespan: float  #: pool start + the end of the last case (start-up included) + the exit
    startup: float = 0.0  #: when the workers take their first case
    exit_s: float = 0.0  #: from the last case's end to the process's exit
    cpu_seconds: float = 0.0  #: Σ rank and worker CPU time of the simulated cases (``--basis cpu``)
    cores: int = 0  #: the node's cores for the CPU bound (0: not applied)

    @property
    def fixed(self) -> float:
        """What every schedule pays whatever the slots: start-up, the one-time pool start, the exit."""
        return self.startup + self.pool_start + self.exit_s

    @property
    def lower_bound(self) -> float:
        return max(self.slot_seconds / self.slots, self.longest_case) + self.fixed

    @property
    def held_bound(self) -> float:
        """The lower bound under the lease rule, where an exclusive case holds every slot: what the schedule
        could reach at best (above :attr:`lower_bound` by what exclusive cases leave idle)."""
        return max(self.held_slot_seconds / self.slots, self.longest_case) + self.fixed

    @property
    def cpu_bound(self) -> float:
        """Start-up, the cases' CPU time spread over every core, the exit (0 when no cores are given)."""
        return self.startup + self.cpu_seconds / self.cores + self.exit_s if self.cores else 0.0

    @property
    def predicted(self) -> float:
        """The makespan, or the CPU bound where the cores, not the schedule, limit the run."""
        return max(self.makespan, self.cpu_bound)

    @property
    def ratio(self) -> float:
        """Makespan over lower bound (1 is optimal)."""
        return self.makespan / self.lower_bound if self.lower_bound else 1.0

    @property
    def utilisation(self) -> float:
        """Σ world × rank time / (slots × makespan)."""
        return self.slot_seconds / (self.slots * self.makespan) if self.makespan else 0.0

    @property
    def lease_wait(self) -> float:
        return sum(r.lease_wait for r in self.runs)

    @property
    def longest_lease_wait(self) -> float:
        return max((r.lease_wait for r in self.runs), default=0.0)

    def row(self) -> dict[str, Any]:
        """The figures of the table (and of the JSON line)."""
        return {"slots": self.slots, "workers": self.workers, "cases": len(self.runs),
                "unschedulable": len(self.unschedulable), "makespan": round(self.makespan, 3),
                "lower_bound": round(self.lower_bound, 3), "ratio": round(self.ratio, 4),
                "held_bound": round(self.held_bound, 3), "cpu_bound": round(self.cpu_bound, 3),
                "predicted": round(self.predicted, 3), "startup": round(self.startup, 3),
                "utilisation": round(self.utilisation, 4), "lease_wait": round(self.lease_wait, 3),
                "longest_lease_wait": round(self.longest_lease_wait, 3)}


# Events at the same time: releases first (they free slots), then lease requests, then patience wake-ups.
_RELEASE, _ASK, _WAKE = 0, 1, 2


class LoadScheduling:
    """Which cases each worker gets: pytest-xdist's ``load`` scheduling (``xdist.scheduler.load``), by the same
    numbers.  Each worker is sent a chunk of consecutive cases at first (a quarter of its share, at least two); a
    worker whose cases fall below a quarter of its share of those left is sent up to half of it, unless its last
    case took 0.1 s or more and it still has two.  One worker (no xdist) gets every case, in order."""

    def __init__(self, cases: int, workers: int) -> None:
        self.pending = deque(range(cases))
        self.queues: list[deque[int]] = [deque() for _ in range(workers)]
        if workers == 1:
            self._send(0, cases)
        elif cases < 2 * workers:
            for index in range(cases):
                self._send(index % workers, 1)
        else:
            for worker in range(workers):
                self._send(worker, max(2, (cases // workers) // 4))

    def _send(self, worker: int, count: int) -> None:
        for _ in range(min(count, len(self.pending))):
            self.queues[worker].append(self.pending.popleft())

    def next_case(self, worker: int) -> int | None:
        """The worker's next case, or None when it has none (it ends: xdist sends more only on a completion)."""
        return self.queues[worker].popleft() if self.queues[worker] else None

    def completed(self, worker: int, duration: float) -> None:
        """A case of ``worker`` ended after ``duration`` seconds: maybe send it more."""
        if not self.pending:
            return
        share = len(self.pending) // len(self.queues)
        waiting = len(self.queues[worker])
        if waiting < max(2, share // 4) and not (duration >= 0.1 and waiting >= 2):
            self._send(worker, max(2, share // 2) - waiting)


def simulate(cases: Sequence[Case], slots: int, workers: int, pool_start: float = 0.0, *, startup: float = 0.0,
             exit_s: float = 0.0, cores: int = 0, startups: Sequence[float] = ()) -> Schedule:
    """Run ``cases`` (in the order workers take them) on ``slots`` slots and ``workers`` workers, which take their
    first case at ``startup`` (``startups``: each worker's own); the process exits ``exit_s`` after the last case.
    ``cores``: apply the CPU bound over that many cores.

    Which worker gets which case is :class:`LoadScheduling` (xdist's ``load``); which waiting request gets
    slots is :func:`~conformance.harness.leases.next_grant`, asked after every event and again when a waiting
    request's patience runs out.  Ties are broken by event kind, then by the order events were made, so the
    result is deterministic.
    """
    if slots < 1 or workers < 1:
        raise ValueError(f"need at least one slot and one worker, got {slots} slots, {workers} workers")
    if startups and len(startups) != workers:
        raise ValueError(f"{len(startups)} start-ups for {workers} workers")
    if startups:
        startup = sum(startups) / workers
    runnable = [c for c in cases if c.world <= slots]
    scheduling = LoadScheduling(len(runnable), workers)
    events: list[tuple[float, int, int, int]] = []  # (time, kind, sequence, case index)
    sequence = itertools.count()
    worker_of: dict[int, int] = {}
    start: dict[int, float] = {}
    asked: dict[int, float] = {}
    granted: dict[int, float] = {}
    case_of_ticket: dict[int, int] = {}
    tickets = itertools.count()
    queue: list[leases.Request] = []
    free = slots
    runs: list[Run] = []

    def push(time: float, kind: int, index: int) -> None:
        heapq.heappush(events, (time, kind, next(sequence), index))

    def take(worker: int, now: float) -> None:
        index = scheduling.next_case(worker)
        if index is not None:
            worker_of[index], start[index] = worker, now
            push(now + runnable[index].worker_s, _ASK, index)

    def finish(index: int, now: float) -> None:
        runs.append(Run(runnable[index].id, worker_of[index], start[index], asked[index],
                        granted.get(index, asked[index]), now))
        scheduling.completed(worker_of[index], now - start[index])
        take(worker_of[index], now)

    for worker in range(workers):
        take(worker, startups[worker] if startups else startup)
    now = startup
    while events:
        now, kind, _, index = heapq.heappop(events)
        case = runnable[index]
        if kind == _RELEASE:
            free += case.wanted(slots)
            finish(index, now)
        elif kind == _ASK:
            asked[index] = now
            if not case.world:
                finish(index, now)
            else:
                ticket = next(tickets)
                case_of_ticket[ticket] = index
                queue.append(leases.Request(ticket, case.wanted(slots), now))
                push(now + leases.PATIENCE_S, _WAKE, index)
        while (chosen := leases.next_grant(queue, free, now)) is not None:
            queue.remove(chosen)
            served = case_of_ticket[chosen.ticket]
            free -= chosen.wanted
            # A request that had to wait sees its grant at its next poll of the queue (leases.next_poll).
            granted[served] = asked[served] + leases.next_poll(now - asked[served])
            push(granted[served] + runnable[served].rank_s, _RELEASE, served)
    if queue:  # cannot happen while every case fits the node; a rule that strands a request must not pass
        raise RuntimeError(f"lease requests never granted: {[runnable[case_of_ticket[r.ticket]].id for r in queue]}")
    return Schedule(
        slots, workers, pool_start, tuple(runs), tuple(c.id for c in cases if c.world > slots),
        sum(c.world * c.rank_s for c in runnable), sum(c.wanted(slots) * c.rank_s for c in runnable),
        max((c.rank_s + c.worker_s for c in runnable), default=0.0),
        pool_start + max((r.end for r in runs), default=startup) + exit_s, startup, exit_s,
        sum(c.rank_cpu_s + c.worker_cpu_s for c in runnable), cores)
