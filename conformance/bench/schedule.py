"""``python -m conformance.bench schedule``: a recorded run replayed through the lease rule, on any node size.

Whether the scheduler packs a run well on a node we do not have is a
discrete-event simulation, not a measurement: the cases of a JSON summary
(``--coc-summary``) keep their recorded times and the world they need, and W
simulated workers run them on N simulated slots under the suite's own rules
(``docs/DESIGN.md#scheduling``):

* the order is the suite's: cases without ranks first, in recorded order, then
  the others sorted by :func:`conformance.plugins.scheduling.rank_order`.  A
  summary records no TP size, so the TP tie-break falls back to the world
  (what ``rank_order`` does for a case that names no TP);
* the workers start once the recorded start-up is over: from the session's
  process start to the first case of each worker (the interpreter, imports,
  collection, the xdist workers' own start), each its own when replayed with
  as many workers as recorded, else the mean over the recorded workers (on
  free cores: the session's process until its session began, then a
  worker's CPU time until its first case);
* the workers get their cases as xdist's ``load`` scheduling sends them
  (:class:`LoadScheduling`): a chunk of consecutive cases each at first, more
  as their own run low;
* a case first spends its time outside the ranks on its worker (as if all
  before the lease): everything its worker did from its start to the next
  case's start (set-up, checks, teardown, reporting; each case's clock,
  ``coc_clock``) but its rank runs and lease waits.  It then asks for a lease
  and waits until :func:`conformance.harness.leases.next_grant` -- the one
  lease rule -- picks it, and takes the slots at its next poll of the queue
  (:func:`conformance.harness.leases.next_poll`), then holds ``world`` slots
  (every slot if it is exclusive, a perf case) for its rank time.  A case
  that leased several times is replayed as one lease;
* pool starts are a one-time cost: the recorded ones are left out of the rank
  times and one mean pool start (or ``--pool-start``) is added to the makespan
  and to the lower bound;
* after the last case, the process still ends its session and exits
  (``--exit-s``, :data:`EXIT_S` measured);
* a case needing more slots than the node has is reported, not simulated (the
  suite skips it); cases the recorded run skipped replay at their recorded,
  tiny durations, so a run recorded on a small node says nothing of the cases
  only a larger one runs.

Times are replayed as recorded (``--basis recorded``): on the node that
recorded them that reproduces the run, and elsewhere keeps what the recorded
node's cores cost (contention).  ``--basis cpu`` replays each case's busiest
rank's CPU time as its rank time and its worker's CPU time as its worker
time: a node with a free core for every rank and every worker, no latency,
and a lower bound on any real node; beside it the CPU bound
``start-up + Σ (rank CPU + worker CPU) / cores`` (``--cores``, default the
slots).  A real node lies between the two bases.

Per slots × workers pair the table gives the makespan, the lower bound
``start-up + max(Σ world × rank time / slots, longest case) + pool start``,
their ratio, the bound under the lease rule (``held bd``: the same with an
exclusive case counted as holding every slot, which is what the lease does),
the slot utilisation ``Σ world × rank time / (slots × makespan)`` and the
simulated lease waits.  With ``--measured SECONDS`` (the recorded run's wall,
process start to exit) it says how far each row's makespan is from it: the
check of the model on the configuration that recorded it.  The last line is
one JSON object with every row.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coc_shared.json_file import read_json
from conformance.caseids import Needs
from conformance.harness import leases
from conformance.plugins import scheduling

#: Seconds from the end of the session (the summary's ``duration``) to the process's exit: the terminal summary,
#: closing the rank pools, the interpreter's exit (measured on the 2-core machine: 1.2-2.5 s).
EXIT_S = 1.5
BASES = ("recorded", "cpu")


class SummaryError(ValueError):
    """The summary cannot be replayed (not a summary, or one that does not record what a case needs)."""


@dataclass(frozen=True)
class Case:
    """One recorded case as the schedule sees it (seconds)."""

    id: str
    world: int  #: slots it leases (0: it runs on its worker only)
    exclusive: bool  #: it holds every slot while it runs (a perf case)
    rank_s: float  #: time holding its slots, pool starts left out
    worker_s: float  #: time on its worker without slots (checks, set-up)
    rank_cpu_s: float = 0.0  #: its ranks' CPU time, summed over ranks and runs
    busiest_cpu_s: float = 0.0  #: the busiest rank's CPU time, summed over runs
    worker_cpu_s: float = 0.0  #: its worker's CPU time for it

    def on_free_cores(self) -> Case:
        """The case on a node with a free core for each of its ranks and for its worker (``--basis cpu``): its
        busiest rank's CPU time for its rank time, its worker's CPU time for its worker time (where recorded)."""
        return replace(self, rank_s=self.busiest_cpu_s if self.rank_cpu_s else self.rank_s,
                       worker_s=self.worker_cpu_s if self.worker_cpu_s else self.worker_s)

    @property
    def needs(self) -> Needs:
        """What the case needs of the node; the summary records no TP sizes."""
        return Needs(frozenset(), self.world, self.exclusive)

    def wanted(self, slots: int) -> int:
        """Slots its lease holds on a node of ``slots``."""
        return slots if self.exclusive else self.world


@dataclass(frozen=True)
class Recording:
    """The cases of a recorded run, in recorded order, the pool starts it paid, and its start-up."""

    cases: tuple[Case, ...]
    pool_start_s: float  #: summed over the run
    pools_started: int
    startup_s: float = 0.0  #: from the session's process start to a worker's first case (mean over workers)
    workers: int = 0  #: the workers that ran cases (1 without xdist; 0: no clocks recorded)
    #: The same on free cores: the session's process until its session began, then a worker's CPU time until its
    #: first case (mean over workers).
    startup_cpu_s: float = 0.0
    #: Each worker's start-up as recorded, earliest first (replayed as they were for as many workers).
    worker_startups: tuple[float, ...] = ()

    @property
    def mean_pool_start(self) -> float:
        return self.pool_start_s / self.pools_started if self.pools_started else 0.0


def case_of(record: Mapping[str, Any], span: float | None = None) -> Case:
    """One summary record as a :class:`Case`; ``span``: its whole time on its worker, from its start to the next
    case's (its call's ``duration`` when unknown)."""
    duration = float(record.get("duration", 0.0)) if span is None else span
    worker_cpu = float((record.get("clock") or {}).get("cpu", 0.0))
    timings = record.get("timings")
    if timings is None:
        return Case(record["id"], 0, False, 0.0, duration, worker_cpu_s=worker_cpu)
    if "world" not in timings:
        raise SummaryError(f"{record['id']}: its timings record no world (a summary written before cases "
                           f"recorded the ranks they need); record the run again")
    ranks = float(timings.get("ranks", 0.0))
    rank_s = max(0.0, ranks - float(timings.get("pool_start", 0.0)))
    worker_s = max(0.0, duration - ranks - float(timings.get("lease_wait", 0.0)))
    world = int(timings["world"])
    cpu = {"rank_cpu_s": float(timings.get("rank_cpu", 0.0)), "busiest_cpu_s": float(timings.get("rank_cpu_max", 0.0)),
           "worker_cpu_s": worker_cpu}
    if world == 0:  # ranks it did not lease: all of its time is its worker's
        return Case(record["id"], 0, False, 0.0, worker_s + rank_s, worker_cpu_s=worker_cpu)
    return Case(record["id"], world, bool(timings.get("exclusive", False)), rank_s, worker_s, **cpu)


def _spans(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> tuple[list[float | None],
                                                                                    tuple[float, ...], float]:
    """Each record's whole time on its worker (from its clock's start to the next case's on that worker, the last
    to the session's end), each worker's start-up (the session's process start to its first case), earliest first,
    and the mean start-up on free cores (:attr:`Recording.startup_cpu_s`); ``None`` spans, no start-ups and 0 where
    the summary records no clocks."""
    clocks = [r.get("clock") for r in records]
    if not all(clocks) or not records:
        return [None] * len(records), (), 0.0
    by_worker: dict[str, list[int]] = defaultdict(list)
    for index, clock in enumerate(clocks):
        by_worker[clock["worker"]].append(index)  # type: ignore[index]
    started = float(summary.get("started", 0.0))
    end = started + float(summary.get("duration", 0.0)) if started else None
    origin = summary.get("process_started") or started
    spans: list[float | None] = [None] * len(records)
    firsts, first_cpus = [], []
    for indices in by_worker.values():
        indices.sort(key=lambda i: clocks[i]["start"])  # type: ignore[index]
        starts = [float(clocks[i]["start"]) for i in indices]  # type: ignore[index]
        for i, begun, after in zip(indices, starts, [*starts[1:], None]):
            if after is not None:
                spans[i] = after - begun
            elif end is not None and end > begun:
                spans[i] = end - begun
        firsts.append(starts[0])
        first_cpus.append(float(clocks[indices[0]].get("process_cpu", 0.0)))  # type: ignore[union-attr]
    startups = tuple(sorted(max(0.0, first - float(origin)) if origin else 0.0 for first in firsts))
    session_start = max(0.0, started - float(origin)) if origin else 0.0
    return spans, startups, session_start + sum(first_cpus) / len(first_cpus)


def read_summary(summary: Mapping[str, Any]) -> Recording:
    """The replayable part of a JSON summary."""
    records = summary.get("cases")
    if not isinstance(records, list):
        raise SummaryError("not a suite summary: it has no list of cases")
    spans, startups, startup_cpu = _spans(summary, records)
    cases = tuple(case_of(r, span) for r, span in zip(records, spans))
    timed = [r["timings"] for r in records if r.get("timings")]
    return Recording(cases, sum(float(t.get("pool_start", 0.0)) for t in timed),
                     sum(int(t.get("pools_started", 0)) for t in timed),
                     sum(startups) / len(startups) if startups else 0.0, len(startups), startup_cpu, startups)


def load(path: Path) -> Recording:
    """:func:`read_summary` of a summary file."""
    summary = read_json(path, SummaryError)
    if not isinstance(summary, dict):
        raise SummaryError(f"{path}: not a suite summary")
    return read_summary(summary)


def suite_order(cases: Sequence[Case]) -> list[Case]:
    """Cases in the order workers take them: those without ranks first (recorded order), then by the suite's
    :func:`~conformance.plugins.scheduling.rank_order`, stably."""
    plain = [c for c in cases if not c.world]
    ranked = sorted((c for c in cases if c.world), key=lambda c: scheduling.rank_order(c.needs))
    return plain + ranked


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


def replay(recording: Recording, slots: int, workers: int, pool_start: float | None = None, *,
           basis: str = "recorded", cores: int | None = None, exit_s: float = EXIT_S) -> Schedule:
    """The recorded cases in the suite's order, simulated after the recorded start-up; the pool start is the
    recorded mean unless given.  ``basis``: times as recorded, or ``"cpu"`` (:meth:`Case.on_free_cores`, with the
    CPU bound over ``cores``, default the slots)."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
    once = recording.mean_pool_start if pool_start is None else pool_start
    cases = suite_order(recording.cases)
    startup = recording.startup_s
    startups = recording.worker_startups if len(recording.worker_startups) == workers else ()
    if basis == "cpu":
        cases = [c.on_free_cores() for c in cases]
        startup, startups = recording.startup_cpu_s or startup, ()
    return simulate(cases, slots, workers, once, startup=startup, exit_s=exit_s,
                    cores=(cores or slots) if basis == "cpu" else 0, startups=startups)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench schedule",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--summary", type=Path, required=True, help="a run's JSON summary (--coc-summary PATH)")
    parser.add_argument("--slots", type=int, nargs="+", default=[16], help="slots (devices) of the node; several")
    parser.add_argument("--workers", type=int, nargs="+", default=[8],
                        help="xdist workers; several (1: the run in one process)")
    parser.add_argument("--pool-start", type=float, default=None,
                        help="one-time pool start in seconds (default: the recorded mean)")
    parser.add_argument("--basis", choices=BASES, default="recorded",
                        help="times as recorded (default), or CPU times: a free core for every rank and worker")
    parser.add_argument("--cores", type=int, default=None, help="the node's cores for the CPU bound of --basis cpu "
                        "(default: the slots)")
    parser.add_argument("--exit-s", type=float, default=EXIT_S,
                        help=f"seconds from the session's end to the process's exit (default {EXIT_S})")
    parser.add_argument("--measured", type=float, default=None, metavar="SECONDS",
                        help="the recorded run's wall (process start to exit): each row's error against it")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if min(args.slots + args.workers) < 1 or (args.cores is not None and args.cores < 1):
        parser.error("--slots, --workers and --cores must be at least 1")
    if min(args.pool_start or 0.0, args.exit_s) < 0:
        parser.error("--pool-start and --exit-s must not be negative")
    try:
        recording = load(args.summary)
    except SummaryError as exc:
        parser.error(str(exc))
    schedules = [replay(recording, s, w, args.pool_start, basis=args.basis, cores=args.cores, exit_s=args.exit_s)
                 for s, w in itertools.product(args.slots, args.workers)]
    print(f"{len(recording.cases)} cases recorded by {recording.workers or '?'} worker(s), start-up "
          f"{recording.startup_s:.1f} s; {recording.pools_started} pool starts, "
          f"{recording.pool_start_s:.1f} s in all (mean {recording.mean_pool_start:.2f} s); "
          f"pool start in the schedule: "
          f"{recording.mean_pool_start if args.pool_start is None else args.pool_start:.2f} s; times: {args.basis}")
    print(f"{'slots':>5} {'workers':>7} {'cases':>5} {'unsched':>7} {'makespan':>9} {'bound':>8} {'ratio':>6} "
          f"{'held bd':>8} {'cpu bd':>8} {'util':>6} {'wait sum':>9} {'wait max':>9}"
          + (f" {'vs measured':>12}" if args.measured else ""))
    for s in schedules:
        error = f" {s.predicted / args.measured - 1:>+11.1%}" if args.measured else ""
        print(f"{s.slots:>5} {s.workers:>7} {len(s.runs):>5} {len(s.unschedulable):>7} {s.makespan:>8.1f}s "
              f"{s.lower_bound:>7.1f}s {s.ratio:>6.3f} {s.held_bound:>7.1f}s {s.cpu_bound:>7.1f}s "
              f"{s.utilisation:>6.1%} {s.lease_wait:>8.1f}s {s.longest_lease_wait:>8.1f}s{error}")
    for s in {s.slots: s for s in schedules if s.unschedulable}.values():
        print(f"{len(s.unschedulable)} cases need more than {s.slots} slots (the suite skips them), e.g. "
              + ", ".join(s.unschedulable[:3]))
    print(json.dumps({"rows": [s.row() for s in schedules], "recorded_pool_start": round(recording.pool_start_s, 3),
                      "recorded_pools_started": recording.pools_started, "basis": args.basis,
                      "recorded_startup": round(recording.startup_s, 3), "recorded_workers": recording.workers,
                      "measured": args.measured}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
