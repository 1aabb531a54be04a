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
  (:class:`~conformance.bench.lease_simulation.LoadScheduling`): a chunk of
  consecutive cases each at first, more as their own run low;
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
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from conformance.bench.lease_simulation import Schedule, simulate
from conformance.bench.recorded_run import Case, Recording, SummaryError, load
from conformance.plugins import scheduling

#: Seconds from the end of the session (the summary's ``duration``) to the process's exit: the terminal summary,
#: closing the rank pools, the interpreter's exit (measured on the 2-core machine: 1.2-2.5 s).
EXIT_S = 1.5
BASES = ("recorded", "cpu")


def suite_order(cases: Sequence[Case]) -> list[Case]:
    """Cases in the order workers take them: those without ranks first (recorded order), then by the suite's
    :func:`~conformance.plugins.scheduling.rank_order`, stably."""
    plain = [c for c in cases if not c.world]
    ranked = sorted((c for c in cases if c.world), key=lambda c: scheduling.rank_order(c.needs))
    return plain + ranked


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
