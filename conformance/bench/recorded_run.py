"""A recorded run as the schedule simulation replays it: each case's rank and worker time, its start-up.

Read from the suite's JSON summary (``--coc-summary``): its time breakdown
(``timings``) and each case's clock (``conformance/plugins/time_breakdown.py``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coc_shared.json_file import read_json
from conformance.caseids import Needs


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
