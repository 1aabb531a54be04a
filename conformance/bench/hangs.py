"""Correct cases slowed by CPU hogs or a long first call, beside deadlocks, under the same tight budget.

``docs/DESIGN.md#time-budget``, ``#progress-evidence``: a hang is a lack of
progress, judged per rank.  On ranks that get a fraction of a core (one
spinning process per core beside them):

* the correct case -- CPU work with an all-reduce after every slice --
  outlasts its budget and must still pass;
* a long first call -- every rank warms a runtime for several budgets, using
  almost no CPU but changing its stack (what compiling or autotuning on a
  device looks like from the host) -- must pass;
* the deadlock -- rank 0 returns, the others wait in an all-reduce it never
  joins -- must be declared at its budget, saying that no rank used CPU time;
* the stalled rank -- rank 0 asleep before any collective while the others
  spin polling an all-reduce it never joins -- must be declared at its budget
  too, naming rank 0 as stalled (the spinners' CPU time is theirs, not its).

Prints, per launcher, the budget, each case's wall time and verdict.

On an accelerator (:func:`on_device`, run by ``python -m conformance.bench
device``) the evidence is the device's own: a rank whose host waits in one
call while its device works through queued kernels for several budgets
(:func:`device_bound`: no CPU time counts on a device rank, and its stack
hardly changes) must pass, carried by the events its device completes; the
deadlock, its device idle, must still be declared at its budget.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from conformance.harness.case import Budget, RankContext, RankOutcome, RankTask
from conformance.harness.case_errors import CaseError, CaseTimeout
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
        going = torch.tensor([1.0 if time.thread_time() - spent < cpu_s else 0.0], device=ctx.device)
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
        dist.all_reduce(torch.ones(1, device=ctx.device), group=ctx.group)


def warm_up_step(depth: int, wait_s: float) -> None:
    """One step of a runtime's warm-up: nested ``depth`` calls deep, then waiting for something else (a device)."""
    if depth > 0:
        warm_up_step(depth - 1, wait_s)
    else:
        time.sleep(wait_s)


def long_first_call(ctx: RankContext, seconds: float) -> int:
    """A correct case whose first call warms a runtime for ``seconds`` (past the budget), then all-reduces."""
    import torch
    import torch.distributed as dist

    ctx.budget_from(0.0)
    draw = random.Random(ctx.rank)
    steps, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:  # the stack changes from step to step, the CPU time hardly
        warm_up_step(draw.randint(0, 4), draw.uniform(0.02, 0.06))
        steps += 1
    dist.all_reduce(torch.ones(1, device=ctx.device), group=ctx.group)
    return steps


def stalled_beside_spinners(ctx: RankContext, stall_s: float) -> None:
    """Rank 0 sleeps before any collective; the others spin polling an all-reduce it never joins.

    Both end after ``stall_s`` (so that ranks as threads do not outlive the run).
    """
    import torch
    import torch.distributed as dist

    ctx.budget_from(0.0)
    end = time.monotonic() + stall_s
    if ctx.rank == 0:
        while time.monotonic() < end:
            time.sleep(0.05)
        return
    work = dist.all_reduce(torch.ones(1, device=ctx.device), group=ctx.group, async_op=True)
    while time.monotonic() < end and not (work is None or work.is_completed()):
        pass


#: Seconds of kernels a device-bound rank queues before it waits for them: longer than a sampling period
#: (50 ms), so the event queued behind them is seen pending, then completed.
DEVICE_ROUND_S = 0.25


def device_bound(ctx: RankContext, seconds: float) -> int:
    """A correct case its device carries: ``seconds`` of rounds, each :data:`DEVICE_ROUND_S` of matmuls queued on
    the rank's device and waited for in one call; then an all-reduce.  Returns the rounds."""
    import torch
    import torch.distributed as dist

    ctx.budget_from(0.0)
    device = torch.device(ctx.device)
    runtime = torch.get_device_module(device)
    a = torch.randn(2048, 2048, device=device) / 2048**0.5
    out = torch.empty_like(a)
    runtime.synchronize(device)
    start = time.monotonic()
    for _ in range(8):
        torch.mm(a, a, out=out)
    runtime.synchronize(device)
    per_round = max(1, int(DEVICE_ROUND_S * 8 / max(time.monotonic() - start, 1e-6)))
    rounds, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        _queue_and_wait(a, out, per_round, lambda: runtime.synchronize(device))
        rounds += 1
    dist.all_reduce(torch.ones(1, device=device), group=ctx.group)
    return rounds


def _queue_and_wait(a: Any, out: Any, count: int, synchronize: Callable[[], None]) -> None:
    """``count`` matmuls queued, then one wait for the device (where the host spends nearly all its time)."""
    import torch

    for _ in range(count):
        torch.mm(a, a, out=out)
    synchronize()


@dataclass
class Timed:
    """How long one case took, and its outcomes or the error that declared it."""

    seconds: float
    result: list[RankOutcome] | CaseError


@dataclass
class OnDevice:
    """What a device-bound correct case and a deadlock did under one budget, on accelerator ranks."""

    budget_s: float
    bound: Timed
    deadlock: Timed


def on_device(launcher: Launcher, devices: Sequence[str], budget: Budget, *, seconds: float,
              ceiling_s: float = 120.0, impl_spec: str = DEFAULT_IMPL) -> OnDevice:
    """Run the device-bound case and the deadlock on two ranks bound to ``devices``; verdicts returned, not raised."""
    def timed(task: RankTask) -> Timed:
        return Timed(*timed_run(launcher, task, devices, impl_spec))

    timed(RankTask(busy_collectives, 2, {"cpu_s": 0.0}, ceiling_s))  # ranks started, off the clock
    bound = timed(RankTask(device_bound, 2, {"seconds": seconds}, ceiling_s, budget=budget))
    return OnDevice(budget.seconds(0.0), bound, timed(RankTask(deadlock, 2, timeout=ceiling_s, budget=budget)))


def device_problems(run: OnDevice, *, most_budgets: float = 6.0) -> list[str]:
    """What the verdicts of :func:`on_device` got wrong (empty: the device's evidence decided both)."""
    problems = []
    bound, stuck = run.bound, run.deadlock
    if isinstance(bound.result, CaseError) or any(o.error is not None for o in bound.result):
        problems.append(f"the device-bound case ({bound.seconds:.1f} s) was declared {_verdict(bound.result)}: the "
                        "events its device completed did not count as progress")
    elif bound.seconds < 2 * run.budget_s:
        problems.append(f"the device-bound case took {bound.seconds:.1f} s, within two budgets of "
                        f"{run.budget_s:g} s: it proves nothing about the evidence")
    if not isinstance(stuck.result, CaseTimeout):
        problems.append(f"the deadlock came out {_verdict(stuck.result)}, not a hang")
    elif stuck.seconds > most_budgets * run.budget_s:
        problems.append(f"the deadlock was declared after {stuck.seconds:.1f} s, past {most_budgets:g} budgets of "
                        f"{run.budget_s:g} s: an idle device was taken for progress")
    return problems


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


def timed_run(launcher: Launcher, task: RankTask, devices: Sequence[str],
              impl_spec: str) -> tuple[float, list[RankOutcome] | CaseError]:
    """How long ``task`` took on ``launcher``, and its outcomes or the error that declared it (never raised)."""
    start = time.monotonic()
    try:
        result: list[RankOutcome] | CaseError = launcher.run(task, devices, impl_spec)
    except CaseError as exc:
        result = exc
    return time.monotonic() - start, result


@dataclass
class SideBySide:
    """What the cases did under the same budget."""

    budget_s: float
    busy_s: float
    busy: list[RankOutcome] | CaseError
    deadlock_s: float
    deadlock: list[RankOutcome] | CaseError
    first_call_s: float
    first_call: list[RankOutcome] | CaseError
    stalled_s: float
    stalled: list[RankOutcome] | CaseError


def side_by_side(launcher: Launcher, budget: Budget, cpu_s: float, *, world_size: int = 2,
                 ceiling_s: float = 120.0, impl_spec: str = DEFAULT_IMPL, first_call_s: float = 3.0,
                 stall_s: float = 30.0) -> SideBySide:
    """Run the correct cases and the hangs on ``launcher``; verdicts are returned, not raised."""
    launcher.run(RankTask(busy_collectives, world_size, {"cpu_s": 0.0}), (), impl_spec)  # ranks started

    def timed(task: RankTask) -> tuple[float, list[RankOutcome] | CaseError]:
        return timed_run(launcher, task, (), impl_spec)

    busy_s, busy = timed(RankTask(busy_collectives, world_size, {"cpu_s": cpu_s}, ceiling_s, budget=budget))
    deadlock_s, stuck = timed(RankTask(deadlock, world_size, timeout=ceiling_s, budget=budget))
    first_s, first = timed(RankTask(long_first_call, world_size, {"seconds": first_call_s}, ceiling_s, budget=budget))
    stalled_s, stalled = timed(RankTask(stalled_beside_spinners, world_size, {"stall_s": stall_s}, ceiling_s,
                                        budget=budget))
    return SideBySide(budget.seconds(0.0), busy_s, busy, deadlock_s, stuck, first_s, first, stalled_s, stalled)


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
        print(f"{name}: long first call {run.first_call_s:.1f} s: {_verdict(run.first_call)}")
        print(f"{name}: stalled rank beside spinners declared after {run.stalled_s:.1f} s: {_verdict(run.stalled)}")
    return 0
