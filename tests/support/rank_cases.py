"""Case functions the harness tests run on ranks (importable by rank processes)."""

from __future__ import annotations

import os
import time

from conformance.harness.case import RankContext


def rank_sum(ctx: RankContext, n: int = 4) -> list[float]:
    import torch
    import torch.distributed as dist

    t = torch.full((n,), float(ctx.rank))
    dist.all_reduce(t, group=ctx.group)
    return t.tolist()


def whoami(ctx: RankContext) -> tuple[int, int, str]:
    return ctx.rank, ctx.world_size, ctx.launcher


def rank0_raises_others_wait(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    if ctx.rank == 0:
        raise ValueError("only rank 0 saw bad input")
    dist.all_reduce(torch.ones(1), group=ctx.group)


def sleep_forever(ctx: RankContext) -> None:
    while True:
        time.sleep(0.05)


def say_then_sleep_forever(ctx: RankContext, path: str) -> None:
    """Hang, once every rank has written its pid to ``path`` + its rank (so a test knows the ranks are busy)."""
    with open(f"{path}{ctx.rank}", "w") as f:
        f.write(str(os.getpid()))
    sleep_forever(ctx)


def rank1_dies(ctx: RankContext) -> None:
    if ctx.rank == 1:
        print("rank 1 about to exit", flush=True)
        os._exit(7)
    time.sleep(60)


def rank1_segfaults(ctx: RankContext) -> None:
    if ctx.rank == 1:
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    time.sleep(60)


def every_rank_raises(ctx: RankContext) -> None:
    raise KeyError(f"rank {ctx.rank}")


def logs_and_prints(ctx: RankContext) -> str:
    import logging

    logging.getLogger("coc.test").warning("rank %d logged", ctx.rank)
    return "ok"


def unpicklable_result(ctx: RankContext) -> object:
    return lambda: None


def count_collectives(ctx: RankContext, chunks: int, use_async: bool) -> list[tuple[str, bool, bool]]:
    import torch
    import torch.distributed as dist

    from conformance.harness.probes import record_collectives

    with record_collectives() as log:
        works = [dist.all_reduce(torch.ones(2), group=ctx.group, async_op=use_async) for _ in range(chunks)]
        for work in works:
            if work is not None:
                work.wait()
        out = torch.empty(2 * ctx.world_size)
        dist.all_gather_into_tensor(out, torch.ones(2), group=ctx.group)
    return [(c.kind, c.async_op is True, c.overlappable) for c in log.calls]


def pid(ctx: RankContext) -> int:
    return os.getpid()


def surroundings(ctx: RankContext, variable: str, module: str) -> tuple[int, str | None, str, bool]:
    """This rank's pid, one environment variable, its working directory, and whether ``module`` was imported
    before the task (by the fork server)."""
    import sys

    return os.getpid(), os.environ.get(variable), os.getcwd(), module in sys.modules


def budget_then_hang(ctx: RankContext) -> None:
    """A quick serial reference, then a hang: declared at the budget, not at the ceiling."""
    ctx.budget_from(0.01)
    while True:
        time.sleep(0.05)


def impl_name(ctx: RankContext) -> str:
    """Declares the floor as its budget at once, then meets the implementation (loading it, the first time)."""
    ctx.budget_from(0.0)
    return str(ctx.impl.name)



def slow_collectives(ctx: RankContext, rounds: int, pause_s: float, recorded: bool = True) -> int:
    """Every rank idle, yet progressing: rank 0 sleeps before each all-reduce, the others wait in it."""
    import contextlib

    import torch
    import torch.distributed as dist

    from conformance.harness.probes import record_collectives

    ctx.budget_from(0.0)
    with record_collectives() if recorded else contextlib.nullcontext():
        for _ in range(rounds):
            if ctx.rank == 0:
                time.sleep(pause_s)
            dist.all_reduce(torch.ones(1), group=ctx.group)
    return rounds


def through_an_alias(ctx: RankContext) -> dict[str, object]:
    """Collectives issued and waited for through names bound before any probe, on live and destroyed groups."""
    import torch

    from conformance.contract.results import observed_collectives
    from conformance.harness.probes import record_collectives
    from tests.support.faulty_impls import MYDIST

    ranks = list(range(ctx.world_size))
    remembered, forgotten = MYDIST.new_group(ranks), MYDIST.new_group(ranks)
    MYDIST.destroy_process_group(forgotten)  # destroyed before any recording saw it
    with record_collectives():
        pass  # sees `remembered` alive
    MYDIST.destroy_process_group(remembered)
    t, w, x = torch.ones(4), torch.ones(4, 4), torch.ones(4, 4)
    with record_collectives() as log:
        log.name_operand("w", w)
        work = MYDIST.all_reduce(t, group=ctx.group, async_op=True)
        _ = x @ w.t()  # in flight with the all-reduce, and it reads w
        work.wait()
        _ = x @ x  # after the wait
        MYDIST.all_gather_into_tensor(torch.empty(4 * ctx.world_size), t, group=ctx.group)  # blocking
        MYDIST.all_reduce(t, group=remembered)
        MYDIST.all_reduce(t, group=forgotten)
        left = MYDIST.all_reduce(t, group=ctx.group, async_op=True)  # not waited while recording
    left.wait()
    seen = observed_collectives(log)
    return {"calls": [(c.kind, c.overlappable, c.pending, c.group_state) for c in seen.collectives],
            "overlapped": [[(m.shape, sorted(m.operands)) for m in c.overlapped] for c in seen.collectives[:1]],
            "gone_ranks": seen.collectives[2].group_ranks, "completed": log.completed}


def probe_corners(ctx: RankContext) -> dict[str, object]:
    """What the probes make of: ``P2POp`` with ``isend`` bound before them, a functional collective, every way of
    waiting on a handle, the coalescing manager, a never-waited collective's phase, a helper thread's collective."""
    import threading

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import isend

    from conformance.contract.results import observed_collectives
    from conformance.harness.probes import record_collectives

    seen: dict[str, object] = {}
    with record_collectives():
        try:
            dist.P2POp(isend, torch.ones(1), (ctx.rank + 1) % ctx.world_size, group=ctx.group)
            seen["p2pop"] = "ok"
        except ValueError as exc:
            seen["p2pop"] = str(exc)
    with record_collectives() as log:
        y = funcol.all_reduce(torch.ones(4), "sum", ctx.group) + 1
    seen["functional"] = [c.op for c in log.calls]
    waits = {"get_future().wait()": lambda w: w.get_future().wait(),
             "torch.futures.wait_all": lambda w: torch.futures.wait_all([w.get_future()]),
             "synchronize()": lambda w: w.synchronize()}
    for how, wait in waits.items():
        with record_collectives() as log:
            wait(dist.all_reduce(torch.ones(4), group=ctx.group, async_op=True))
        seen[how] = [c.waited is not None for c in log.calls]
    with record_collectives() as log:
        dist.all_reduce_coalesced([torch.ones(4), torch.ones(2)], group=ctx.group, async_op=True).wait()
    seen["all_reduce_coalesced"] = [c.waited is not None for c in log.calls]
    with record_collectives() as log:
        with dist.distributed_c10d._coalescing_manager(ctx.group, async_ops=True) as cm:
            dist.all_reduce(torch.ones(4), group=ctx.group)
            dist.all_reduce(torch.ones(3), group=ctx.group)
        cm.wait()
    seen["coalescing_manager"] = [(c.kind, c.waited is not None) for c in log.calls]
    with record_collectives() as log:
        left = dist.all_reduce(torch.ones(4), group=ctx.group, async_op=True)
        _ = torch.ones(2, 2) @ torch.ones(2, 2)
        log.mark("phase end")
        end = len(log.events)
        _ = torch.ones(3, 3) @ torch.ones(3, 3)
    left.wait()
    seen["phase_overlapped"] = [[m.shape for m in c.overlapped] for c in observed_collectives(log, 0, end).collectives]
    with record_collectives() as log:
        helper = threading.Thread(target=lambda: dist.all_reduce(torch.ones(4), group=ctx.group))
        helper.start()
        helper.join()
    seen["helper_thread"] = observed_collectives(log).other_threads
    del y
    return seen
