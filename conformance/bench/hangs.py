"""A correct case slowed by CPU hogs, beside a real deadlock, under the same tight budget.

``docs/DESIGN.md#time-budget``: a hang is a lack of progress.  On ranks that
get a fraction of a core (one spinning process per core beside them), the
correct case -- CPU work with an all-reduce after every slice -- outlasts its
budget and must still pass; the deadlock -- rank 0 returns, the others wait
in an all-reduce it never joins -- must be declared at its budget, saying that
no rank used CPU time.  Prints, per launcher, the budget, the correct case's
wall time and outcome, and when and how the deadlock was declared.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from conformance.harness.case import Budget, RankContext, RankOutcome, RankTask
from conformance.harness.case_errors import CaseError
from conformance.harness.launchers import Launcher
from conformance.options import DEFAULT_IMPL


def busy_collectives(ctx: RankContext, cpu_s: float) -> int:
    """A correct case: ``cpu_s`` of CPU work on each rank, an all-reduce after every slice."""
    import torch
    import torch.distributed as dist

    ctx.budget_from(0.0)
    rounds, spent = 0, time.thread_time()
    a = torch.rand(64, 64)
    while True:  # every rank leaves after the same all-reduce: the first that has spent cpu_s decides
        for _ in range(20):
            a = torch.tanh(a @ a)
        going = torch.tensor([1.0 if time.thread_time() - spent < cpu_s else 0.0])
        dist.all_reduce(going, op=dist.ReduceOp.MIN, group=ctx.group)
        rounds += 1
        if going.item() == 0.0:
            return rounds


def deadlock(ctx: RankContext) -> None:
    """A real deadlock: rank 0 returns, the others wait in an all-reduce it never joins."""
    import torch
    import torch.distributed as dist

    ctx.budget_from(0.0)
    if ctx.rank != 0:
        dist.all_reduce(torch.ones(1), group=ctx.group)


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU while the block runs (a busy CI runner)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@dataclass
class SideBySide:
    """What the two cases did under the same budget."""

    budget_s: float
    busy_s: float
    busy: list[RankOutcome] | CaseError
    deadlock_s: float
    deadlock: list[RankOutcome] | CaseError


def side_by_side(launcher: Launcher, budget: Budget, cpu_s: float, *, world_size: int = 2,
                 ceiling_s: float = 120.0, impl_spec: str = DEFAULT_IMPL) -> SideBySide:
    """Run the correct case, then the deadlock, on ``launcher``; verdicts are returned, not raised."""
    launcher.run(RankTask(busy_collectives, world_size, {"cpu_s": 0.0}), (), impl_spec)  # ranks started

    def timed(task: RankTask) -> tuple[float, list[RankOutcome] | CaseError]:
        start = time.monotonic()
        try:
            result: list[RankOutcome] | CaseError = launcher.run(task, (), impl_spec)
        except CaseError as exc:
            result = exc
        return time.monotonic() - start, result

    busy_s, busy = timed(RankTask(busy_collectives, world_size, {"cpu_s": cpu_s}, ceiling_s, budget=budget))
    deadlock_s, stuck = timed(RankTask(deadlock, world_size, timeout=ceiling_s, budget=budget))
    return SideBySide(budget.seconds(0.0), busy_s, busy, deadlock_s, stuck)


def _verdict(result: list[RankOutcome] | CaseError) -> str:
    if isinstance(result, CaseError):
        return f"{type(result).__name__}: {str(result).splitlines()[0].split(': ', 1)[-1]}"
    errors = [o.error.describe() for o in result if o.error is not None]
    return "; ".join(errors) if errors else "passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench hangs", description=__doc__)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="spinning processes (one per core)")
    parser.add_argument("--budget-floor", type=float, default=0.5, help="the cases' budget, seconds")
    parser.add_argument("--cpu-s", type=float, default=1.0, help="CPU seconds of work per rank in the correct case")
    parser.add_argument("--launcher", choices=("process", "threaded", "both"), default="both")
    args = parser.parse_args(argv)
    from conformance.harness.launchers.devices import cpu
    from conformance.harness.launchers.process_launcher import ProcessLauncher
    from conformance.harness.launchers.threaded import ThreadedLauncher

    names = ("process", "threaded") if args.launcher == "both" else (args.launcher,)
    print(f"{args.hogs} CPU hog(s) on {os.cpu_count()} core(s), load average {os.getloadavg()[0]:.1f}")
    for name in names:
        launcher: Launcher = ProcessLauncher(cpu(8), max_live_ranks=2) if name == "process" else ThreadedLauncher()
        try:
            with cpu_hogs(args.hogs):
                run = side_by_side(launcher, Budget(factor=20, floor=args.budget_floor), args.cpu_s)
        finally:
            launcher.close()
        print(f"{name}: budget {run.budget_s:g} s; correct case {run.busy_s:.1f} s: {_verdict(run.busy)}")
        print(f"{name}: deadlock declared after {run.deadlock_s:.1f} s: {_verdict(run.deadlock)}")
    return 0
