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
* an idle worker takes the next case of that one list -- an approximation of
  xdist's ``load`` scheduling, which hands out cases in chunks and then one by
  one as workers finish;
* a case first spends its time outside the ranks on its worker (checks and
  set-up, as if all before the lease), then asks for a lease and waits until
  :func:`conformance.harness.leases.next_grant` -- the one lease rule -- picks
  it, then holds ``world`` slots (every slot if it is exclusive, a perf case)
  for its rank time.  A case that leased several times is replayed as one lease;
* pool starts are a one-time cost: the recorded ones are left out of the rank
  times and one mean pool start (or ``--pool-start``) is added to the makespan
  and to the lower bound;
* a case needing more slots than the node has is reported, not simulated (the
  suite skips it); cases the recorded run skipped replay at their recorded,
  tiny durations, so a run recorded on a small node says nothing of the cases
  only a larger one runs.

Per slots × workers pair the table gives the makespan, the lower bound
``max(Σ world × rank time / slots, longest case) + pool start``, their ratio,
the bound under the lease rule (``held bd``: the same with an exclusive case
counted as holding every slot, which is what the lease does), the slot
utilisation ``Σ world × rank time / (slots × makespan)`` and the simulated
lease waits.  The last line is one JSON object with every row.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.caseids import Needs
from conformance.harness import leases
from conformance.plugins import scheduling


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

    @property
    def needs(self) -> Needs:
        """What the case needs of the node; the summary records no TP sizes."""
        return Needs(frozenset(), self.world, self.exclusive)

    def wanted(self, slots: int) -> int:
        """Slots its lease holds on a node of ``slots``."""
        return slots if self.exclusive else self.world


@dataclass(frozen=True)
class Recording:
    """The cases of a recorded run, in recorded order, and the pool starts it paid."""

    cases: tuple[Case, ...]
    pool_start_s: float  #: summed over the run
    pools_started: int

    @property
    def mean_pool_start(self) -> float:
        return self.pool_start_s / self.pools_started if self.pools_started else 0.0


def case_of(record: Mapping[str, Any]) -> Case:
    """One summary record as a :class:`Case`."""
    duration = float(record.get("duration", 0.0))
    timings = record.get("timings")
    if timings is None:
        return Case(record["id"], 0, False, 0.0, duration)
    if "world" not in timings:
        raise SummaryError(f"{record['id']}: its timings record no world (a summary written before cases "
                           f"recorded the ranks they need); record the run again")
    ranks = float(timings.get("ranks", 0.0))
    rank_s = max(0.0, ranks - float(timings.get("pool_start", 0.0)))
    worker_s = max(0.0, duration - ranks - float(timings.get("lease_wait", 0.0)))
    world = int(timings["world"])
    if world == 0:  # ranks it did not lease: all of its time is its worker's
        return Case(record["id"], 0, False, 0.0, worker_s + rank_s)
    return Case(record["id"], world, bool(timings.get("exclusive", False)), rank_s, worker_s)


def read_summary(summary: Mapping[str, Any]) -> Recording:
    """The replayable part of a JSON summary."""
    records = summary.get("cases")
    if not isinstance(records, list):
        raise SummaryError("not a suite summary: it has no list of cases")
    cases = tuple(case_of(r) for r in records)
    timed = [r["timings"] for r in records if r.get("timings")]
    return Recording(cases, sum(float(t.get("pool_start", 0.0)) for t in timed),
                     sum(int(t.get("pools_started", 0)) for t in timed))


def load(path: Path) -> Recording:
    """:func:`read_summary` of a summary file."""
    try:
        summary = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SummaryError(f"cannot read {path}: {exc}") from exc
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
    makespan: float  #: pool start + the end of the last case

    @property
    def lower_bound(self) -> float:
        return max(self.slot_seconds / self.slots, self.longest_case) + self.pool_start

    @property
    def held_bound(self) -> float:
        """The lower bound under the lease rule, where an exclusive case holds every slot: what the schedule
        could reach at best (above :attr:`lower_bound` by what exclusive cases leave idle)."""
        return max(self.held_slot_seconds / self.slots, self.longest_case) + self.pool_start

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
                "held_bound": round(self.held_bound, 3),
                "utilisation": round(self.utilisation, 4), "lease_wait": round(self.lease_wait, 3),
                "longest_lease_wait": round(self.longest_lease_wait, 3)}


# Events at the same time: releases first (they free slots), then lease requests, then patience wake-ups.
_RELEASE, _ASK, _WAKE = 0, 1, 2


def simulate(cases: Sequence[Case], slots: int, workers: int, pool_start: float = 0.0) -> Schedule:
    """Run ``cases`` (in the order workers take them) on ``slots`` slots and ``workers`` workers.

    Which waiting request gets slots is :func:`~conformance.harness.leases.next_grant`, asked after every
    event and again when a waiting request's patience runs out.  Ties are broken by event kind, then by
    the order events were made, so the result is deterministic.
    """
    if slots < 1 or workers < 1:
        raise ValueError(f"need at least one slot and one worker, got {slots} slots, {workers} workers")
    runnable = [c for c in cases if c.world <= slots]
    pending = deque(range(len(runnable)))
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
        if pending:
            index = pending.popleft()
            worker_of[index], start[index] = worker, now
            push(now + runnable[index].worker_s, _ASK, index)

    def finish(index: int, now: float) -> None:
        runs.append(Run(runnable[index].id, worker_of[index], start[index], asked[index],
                        granted.get(index, asked[index]), now))
        take(worker_of[index], now)

    for worker in range(workers):
        take(worker, 0.0)
    now = 0.0
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
            granted[served] = now
            push(now + runnable[served].rank_s, _RELEASE, served)
    if queue:  # cannot happen while every case fits the node; a rule that strands a request must not pass
        raise RuntimeError(f"lease requests never granted: {[runnable[case_of_ticket[r.ticket]].id for r in queue]}")
    return Schedule(
        slots, workers, pool_start, tuple(runs), tuple(c.id for c in cases if c.world > slots),
        sum(c.world * c.rank_s for c in runnable), sum(c.wanted(slots) * c.rank_s for c in runnable),
        max((c.rank_s + c.worker_s for c in runnable), default=0.0),
        pool_start + max((r.end for r in runs), default=0.0))


def replay(recording: Recording, slots: int, workers: int, pool_start: float | None = None) -> Schedule:
    """The recorded cases in the suite's order, simulated; the pool start is the recorded mean unless given."""
    once = recording.mean_pool_start if pool_start is None else pool_start
    return simulate(suite_order(recording.cases), slots, workers, once)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench schedule",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--summary", type=Path, required=True, help="a run's JSON summary (--coc-summary PATH)")
    parser.add_argument("--slots", type=int, nargs="+", default=[16], help="slots (devices) of the node; several")
    parser.add_argument("--workers", type=int, nargs="+", default=[8], help="xdist workers; several")
    parser.add_argument("--pool-start", type=float, default=None,
                        help="one-time pool start in seconds (default: the recorded mean)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if min(args.slots + args.workers) < 1:
        parser.error("--slots and --workers must be at least 1")
    if args.pool_start is not None and args.pool_start < 0:
        parser.error("--pool-start must not be negative")
    try:
        recording = load(args.summary)
    except SummaryError as exc:
        parser.error(str(exc))
    schedules = [replay(recording, s, w, args.pool_start) for s, w in itertools.product(args.slots, args.workers)]
    print(f"{len(recording.cases)} cases recorded; {recording.pools_started} pool starts, "
          f"{recording.pool_start_s:.1f} s in all (mean {recording.mean_pool_start:.2f} s); "
          f"pool start in the schedule: "
          f"{recording.mean_pool_start if args.pool_start is None else args.pool_start:.2f} s")
    print(f"{'slots':>5} {'workers':>7} {'cases':>5} {'unsched':>7} {'makespan':>9} {'bound':>8} {'ratio':>6} "
          f"{'held bd':>8} {'util':>6} {'wait sum':>9} {'wait max':>9}")
    for s in schedules:
        print(f"{s.slots:>5} {s.workers:>7} {len(s.runs):>5} {len(s.unschedulable):>7} {s.makespan:>8.1f}s "
              f"{s.lower_bound:>7.1f}s {s.ratio:>6.3f} {s.held_bound:>7.1f}s {s.utilisation:>6.1%} "
              f"{s.lease_wait:>8.1f}s {s.longest_lease_wait:>8.1f}s")
    for s in {s.slots: s for s in schedules if s.unschedulable}.values():
        print(f"{len(s.unschedulable)} cases need more than {s.slots} slots (the suite skips them), e.g. "
              + ", ".join(s.unschedulable[:3]))
    print(json.dumps({"rows": [s.row() for s in schedules], "recorded_pool_start": round(recording.pool_start_s, 3),
                      "recorded_pools_started": recording.pools_started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
