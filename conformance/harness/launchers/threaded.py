"""Ranks as threads of the pytest process, on torch's threaded process group.

Starts in milliseconds, so it suits fast CPU numerics.  Its collectives are
synchronous even when called with ``async_op=True``: it checks results, never
overlap.  A rank that raises while others wait in a collective is a hang on any
real backend; here it is reported as one immediately.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from conformance.harness.case import RankContext, RankOutcome, RankTask, run_on_rank
from conformance.harness.case_clock import CaseClock
from conformance.harness.case_errors import CaseTimeout
from conformance.harness.cpu_time import ProgressWatch, Rank
from conformance.harness.impl_loader import preload_implementation
from conformance.harness.launchers import StartsNothingAhead
from conformance.harness.progress import TaskSampler
from conformance.harness.thread_stacks import format_stack, thread_stacks

_LOCK = threading.Lock()  # one threaded world at a time per process


class ThreadedLauncher(StartsNothingAhead):
    name = "threaded"
    relaunches = False  #: every run's rank threads are new, but the process (and what it keeps) is the session's

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.multi_threaded_pg import (
            ProcessLocalGroup,
            _install_threaded_pg,
            _uninstall_threaded_pg,
        )

        from conformance.harness.probes.waits import count_completions

        preload_implementation(impl_spec)  # before the clock: the load is not the case's
        count_completions()
        with _LOCK:
            world = _install_threaded_pg()
            torch._C._distributed_c10d._set_thread_isolation_mode(True)  # type: ignore[attr-defined]
            store = dist.HashStore()
            outcomes: dict[int, RankOutcome] = {}
            terminated: set[int] = set()
            clock = CaseClock(task.timeout)

            def rank_thread(rank: int) -> None:
                dist.init_process_group("threaded", rank=rank, world_size=task.world_size, store=store)
                ctx = RankContext(rank, task.world_size, "cpu", impl_spec, self.name,
                                  on_budget=lambda seconds: clock.budget(seconds, rank), budget=task.budget,
                                  device_thread_backward=task.device_thread_backward)
                try:
                    outcome = run_on_rank(task.fn, task.params, ctx, capture_stdio=False, carry=_world_carry())
                    if outcome.error is not None and outcome.error.type_name == "builtins.SystemExit":
                        terminated.add(rank)  # woken out of a collective nobody else joined
                    outcomes[rank] = outcome
                    if outcome.error is not None:
                        ProcessLocalGroup.exception_handle(None)
                finally:
                    if dist.distributed_c10d._world is world:
                        dist.destroy_process_group()

            threads = [
                threading.Thread(target=rank_thread, args=(r,), name=f"coc-rank-{r}", daemon=True)
                for r in range(task.world_size)
            ]
            try:
                for t in threads:
                    t.start()
                clock.watch = _thread_watch(threads)
                samplers = {r: _sampler(t) for r, t in enumerate(threads) if t.ident is not None}
                while stuck := [r for r, t in enumerate(threads) if t.is_alive()]:
                    threads[stuck[0]].join(min(0.05, clock.left()))
                    if clock.wants_evidence():
                        for r in stuck:
                            clock.report(r, samplers[r].sample())
                    why = clock.hung([r for r in stuck if threads[r].is_alive()])
                    if why:
                        stacks = _thread_stacks(threads)
                        ProcessLocalGroup.exception_handle(None)
                        raise CaseTimeout(f"{task.name}: {why}", stacks=stacks,
                                          outcomes=[outcomes[r] for r in sorted(outcomes)])
                if terminated:
                    raised = sorted(r for r, o in outcomes.items() if not o.ok and r not in terminated)
                    raise CaseTimeout(
                        f"{task.name}: rank(s) {sorted(terminated)} were left waiting in a "
                        f"collective after rank(s) {raised} raised (a hang on a real backend)",
                        outcomes=[outcomes[r] for r in sorted(outcomes)],
                    )
                return [outcomes[r] for r in range(task.world_size)]
            finally:
                ProcessLocalGroup.reset()
                _uninstall_threaded_pg()
                torch._C._distributed_c10d._set_thread_isolation_mode(False)  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


def _thread_watch(threads: Sequence[threading.Thread]) -> ProgressWatch | None:
    """The CPU time of each still running rank's thread (None where it cannot be read).

    A rank that already returned has no thread left to read, and needs none: only pending ranks are judged.
    """
    watch = ProgressWatch({r: Rank(os.getpid(), t.native_id) for r, t in enumerate(threads)
                           if t.native_id and t.is_alive()})
    if not watch.available:  # a rank that returned between the two reads leaves no thread: watch the others
        watch = ProgressWatch({r: rank for r, rank in watch.ranks.items() if threads[r].is_alive()})
    return watch if watch.available else None


def _sampler(thread: threading.Thread) -> TaskSampler:
    """A rank thread's evidence: its stack and the collectives it (or a thread working for it) saw complete since
    now."""
    from conformance.harness.completions import COMPLETED

    assert thread.ident is not None
    ident, begun = thread.ident, COMPLETED.of_rank(thread.ident)
    return TaskSampler(ident, lambda: COMPLETED.of_rank(ident) - begun)


def _world_carry() -> Callable[[], AbstractContextManager[None]]:
    """What a helper thread of this rank thread takes over to issue its collectives, while it works for the rank:
    the threaded process group keeps a rank's world in Python thread-locals, and its group registry per thread
    (thread isolation mode), where a real backend's groups are the process's.  Given back when the helper is done
    (a later thread may get the same id, and a registry entry left behind would refuse its groups)."""
    import torch
    import torch.distributed as dist

    world = dist.distributed_c10d._world
    mine = world._get_world()  # type: ignore[attr-defined]
    c10d = torch._C._distributed_c10d

    @contextmanager
    def carry() -> Iterator[None]:
        type(world)._world.world = mine  # type: ignore[attr-defined]
        names = list(mine.pg_names.items())
        for group, name in names:
            c10d._register_process_group(name, group)
        try:
            yield
        finally:
            for _, name in names:
                c10d._unregister_process_group(name)
            del type(world)._world.world  # type: ignore[attr-defined]

    return carry


def _thread_stacks(threads: Sequence[threading.Thread]) -> dict[int, str]:
    """Each rank thread's stack, and those of the threads working for it (its backward's, where a hang often is)."""
    from conformance.harness import rank_threads

    stacks = thread_stacks()
    found = {}
    for rank, thread in enumerate(threads):
        text = format_stack(stacks[thread.ident]) if thread.ident in stacks else "(finished)"
        for helper, _ in rank_threads.helpers_of(thread.ident or 0):
            if helper in stacks:
                text += f"--- a thread working for it ---\n{format_stack(stacks[helper])}"
        found[rank] = text
    return found
