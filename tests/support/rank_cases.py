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

    from conformance.harness.observed import observed_collectives
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

    from conformance.harness.observed import observed_collectives
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
        helper = threading.Thread(target=lambda: dist.all_reduce(torch.ones(4), group=ctx.group), name="coc-helper")
        helper.start()
        helper.join()
    seen["helper_thread"] = observed_collectives(log).other_threads
    del y
    return seen


#: What the probes kept in Python thread-locals before issue 42 (a rank's api-nesting stack), reduced to the line
#: that crashed on an accelerator: a thread that never recorded has no such attribute.
_THREAD_LOCAL_PROBE = __import__("threading").local()


def _thread_local_probe_call(fn: object, *args: object, **kwargs: object) -> object:
    stack = _THREAD_LOCAL_PROBE.api_stack  # AttributeError on a thread that never entered the recording
    stack.append(fn)
    try:
        return fn(*args, **kwargs)  # type: ignore[operator]
    finally:
        stack.pop()


def backward_on_device_thread(ctx: RankContext, off_thread: bool) -> dict[str, object]:
    """A custom Function whose backward all-reduces asynchronously and multiplies while it is in flight, run
    through the harness's backward: what the probes recorded, on which thread, and what a probe that kept its
    state in Python thread-locals (as they did) made of it."""
    import threading

    import torch
    import torch.distributed as dist

    from conformance.harness.completions import COMPLETED
    from conformance.harness.device_thread import run_backward
    from conformance.harness.observed import observed_collectives
    from conformance.harness.probes import record_collectives

    threads: list[str] = []
    old_style = {"on": False}

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(fctx: object, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            fctx.save_for_backward(x, w)  # type: ignore[attr-defined]
            return x @ w.t()

        @staticmethod
        def backward(fctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = fctx.saved_tensors  # type: ignore[attr-defined]
            threads.append(threading.current_thread().name)
            dx = grad @ w
            if old_style["on"]:
                work = _thread_local_probe_call(dist.all_reduce, dx, group=ctx.group, async_op=True)
            else:
                work = dist.all_reduce(dx, group=ctx.group, async_op=True)
            dw = grad.t() @ x  # in flight with the all-reduce
            work.wait()
            return dx, dw

    def step() -> None:
        x = torch.ones(4, 3, requires_grad=True)
        w = torch.ones(2, 3, requires_grad=True)
        y = Linear.apply(x, w)
        run_backward(lambda: y.backward(torch.ones(4, 2)), device=ctx.device, off_thread=off_thread)

    rank = threading.get_ident()
    begun = COMPLETED.of_rank(rank)
    with record_collectives() as log:
        step()
    seen = observed_collectives(log)
    _THREAD_LOCAL_PROBE.api_stack = []  # the old probes' recording began on this thread only
    old_style["on"] = True
    try:
        step()
        old: str | None = None
    except Exception as exc:  # noqa: BLE001 - what the old probes raised is the result
        old = f"{type(exc).__name__}: {exc}"
    finally:
        del _THREAD_LOCAL_PROBE.api_stack
    return {"threads": threads[:1], "calls": [(c.kind, c.overlappable, c.pending) for c in seen.collectives],
            "overlapped": [[m.shape for m in c.overlapped] for c in seen.collectives],
            "other_threads": (seen.other_threads, seen.other_thread_matmuls),
            "completed_for_rank": COMPLETED.of_rank(rank) > begun,
            "old_probe": old}


def every_wait_style(ctx: RankContext) -> dict[str, object]:
    """Two asynchronous all-reduces waited for in each documented way (and on another thread): which the probes
    saw waited; what a callback registered inside the recording, and a helper thread's matmul, left in it."""
    import threading
    import time

    import torch
    import torch.distributed as dist

    from conformance.harness.observed import observed_collectives
    from conformance.harness.probes import record_collectives

    def poll(done: object) -> None:
        while not done():  # type: ignore[operator]
            time.sleep(0.001)

    def on_another_thread(works: list[dist.Work]) -> None:
        waiter = threading.Thread(target=lambda: [w.wait() for w in works], name="coc-waiter")
        waiter.start()
        waiter.join()

    styles = {
        "collect_all": lambda ws: torch.futures.collect_all([w.get_future() for w in ws]).wait(),
        "then": lambda ws: [w.get_future().then(lambda f: f.value()).wait() for w in ws],
        "then then": lambda ws: [w.get_future().then(lambda f: 1).then(lambda f: 2).wait() for w in ws],
        "wait_all": lambda ws: torch.futures.wait_all([w.get_future() for w in ws]),
        "Future.wait": lambda ws: [w.get_future().wait() for w in ws],
        "Future.done polled": lambda ws: [poll(w.get_future().done) for w in ws],
        "Work.is_completed polled": lambda ws: [poll(w.is_completed) for w in ws],
        "on another thread": on_another_thread,
    }
    seen: dict[str, object] = {}
    for how, wait in styles.items():
        with record_collectives() as log:
            works = [dist.all_reduce(torch.ones(4, device=ctx.device), group=ctx.group, async_op=True)
                     for _ in range(2)]
            wait(works)
        seen[how] = [c.waited is not None for c in log.calls]
    with record_collectives() as log:  # a callback only: the program never waited
        work = dist.all_reduce(torch.ones(4, device=ctx.device), group=ctx.group, async_op=True)
        work.get_future().then(lambda f: f.value())
        time.sleep(0.05)
    seen["callback only"] = [c.waited is not None for c in log.calls]
    work.wait()
    with record_collectives() as log:  # the callback multiplies, on whichever thread completes the future
        work = dist.all_reduce(torch.ones(4, device=ctx.device), group=ctx.group, async_op=True)
        work.get_future().then(lambda f: torch.ones(3, 3) @ torch.ones(3, 3)).wait()
    timeline = observed_collectives(log)
    seen["callback matmul"] = ([e.shape for e in log.events if e.what == "matmul"],
                               timeline.other_threads + timeline.other_thread_matmuls)
    with record_collectives() as log:  # a helper thread multiplies: unseen, so named
        helper = threading.Thread(target=lambda: torch.ones(2, 2) @ torch.ones(2, 2), name="coc-helper")
        helper.start()
        helper.join()
    timeline = observed_collectives(log)
    seen["helper matmul"] = (timeline.other_threads, timeline.other_thread_matmuls)

    def reduce_inside(_: object) -> int:  # a collective launched and waited inside the callback
        dist.all_reduce(torch.ones(4, device=ctx.device), group=ctx.group, async_op=True).wait()
        return 1

    with record_collectives() as log:  # the program waits on the future the callback chains
        launched = dist.all_reduce(torch.ones(4, device=ctx.device), group=ctx.group, async_op=True)
        launched.get_future().then(reduce_inside).wait()
    seen["collective in a callback"] = [c.waited is not None for c in log.calls]
    with record_collectives() as log:  # the same, the callback run inline (its future done already)
        future = dist.all_reduce(torch.ones(4, device=ctx.device), group=ctx.group, async_op=True).get_future()
        poll(future.done)
        future.then(reduce_inside).wait()
    seen["collective in an inline callback"] = [c.waited is not None for c in log.calls]
    later: torch.futures.Future[None] = torch.futures.Future()
    later.then(lambda _: torch.ones(5, 5) @ torch.ones(5, 5))  # registered before the recording
    go = threading.Event()
    completer = threading.Thread(target=lambda: (go.wait(), later.set_result(None)), name="coc-completer")
    completer.start()  # before the recording: no mode, not watched
    with record_collectives() as log:  # ... and run during it, on that thread
        go.set()
        completer.join()
    timeline = observed_collectives(log)
    seen["callback registered before"] = timeline.other_thread_matmuls
    return seen


def warns_from_its_backward(ctx: RankContext) -> dict[str, object]:
    """Every rank warns and logs at once, from its backward (on the emulated device thread), and all-reduces
    there: what each rank observed of warnings, and the sum."""
    import logging
    import threading
    import warnings

    import torch
    import torch.distributed as dist

    from conformance.harness.rank_warnings import observed_warnings

    def backward() -> float:
        dist.barrier(group=ctx.group)  # every rank warns at the same moment
        warnings.warn(f"rank {ctx.rank} warned", UserWarning, stacklevel=1)
        logging.getLogger("coc.test").warning("rank %d logged from %s", ctx.rank, threading.current_thread().name)
        total = torch.ones(1)
        dist.all_reduce(total, group=ctx.group)
        dist.barrier(group=ctx.group)  # no rank stops observing before every rank has warned
        return float(total.item())

    with observed_warnings() as said:
        total = ctx.backward(backward)
    return {"said": sorted(said), "total": total}


def calls_npu_named_kernels(ctx: RankContext, calls: int) -> None:
    """Rank ``r`` calls torch_npu's MC² all-reduce kernel (a CPU stand-in) ``calls + r`` times inside a recording, as
    an implementation's call does; once outside any recording (the suite's own work); and, recorded, an op of the
    ``npu`` namespace that is no fused kernel and one of another namespace under the kernel's name.  Defines ops
    under ``npu``: run it only on ranks of their own (no torch_npu there)."""
    import torch

    from conformance.harness.probes import record_collectives
    from tests.support import fused_kernel_impl  # noqa: F401 - defines torch.ops.npu.npu_mm_all_reduce_base

    global _OTHER_OPS
    if _OTHER_OPS is None:
        _OTHER_OPS = [torch.library.Library("npu", "FRAGMENT"), torch.library.Library("coc_not_npu", "DEF")]
        _OTHER_OPS[0].define("npu_fast_gelu(Tensor x) -> Tensor")
        _OTHER_OPS[0].impl("npu_fast_gelu", lambda x: x * 1.0, "CPU")
        _OTHER_OPS[1].define("npu_mm_all_reduce_base(Tensor x1, Tensor x2, str hcom) -> Tensor")
        _OTHER_OPS[1].impl("npu_mm_all_reduce_base", lambda x1, x2, hcom: x1 @ x2, "CPU")
    x = torch.ones(2, 2)
    torch.ops.npu.npu_mm_all_reduce_base(x, x, "hcom")
    with record_collectives():
        for _ in range(calls + ctx.rank):
            torch.ops.npu.npu_mm_all_reduce_base(x, x, "hcom")
        torch.ops.npu.npu_fast_gelu(x)
        torch.ops.coc_not_npu.npu_mm_all_reduce_base(x, x, "hcom")


_OTHER_OPS: list[object] | None = None
