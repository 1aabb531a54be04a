"""Tiny rank launchers, a collective recorder and a serial reference for the tests.

Two launchers, both CPU only:

* :func:`run_threaded` – one thread per rank on torch's threaded process group.
  Fast (no process start-up), but asynchronous collectives complete
  synchronously and module globals are shared between ranks, so it is only
  for code that takes its process group explicitly (overlap engine, scripted
  functions), not for megatron's ``parallel_state``.
* :class:`GlooPool` – real gloo processes, forked from the test process so the
  already imported torch / megatron are reused (spawning and importing again
  costs seconds per rank).  Kept alive across tests; every task is a picklable
  module-level function ``fn(rank, world_size, *args)``.

The full-featured rank pool of the conformance suite lives in ``conformance/``.

:class:`LinearProblem` is one TP linear layer problem with its float64 serial
answers, and knows which shard of each tensor a rank owns (docs/DESIGN.md#layouts).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import sys
import tempfile
import threading
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

TASK_TIMEOUT_S = 60.0


class RankFailure(AssertionError):
    """A rank raised; carries the rank's formatted traceback."""


def run_threaded(world_size: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` threaded-PG ranks.

    Returns the per-rank results in rank order; re-raises the first rank
    failure as :class:`RankFailure` (with the rank's traceback).
    """
    from torch.testing._internal.distributed.multi_threaded_pg import (
        ProcessLocalGroup,
        _install_threaded_pg,
        _uninstall_threaded_pg,
    )

    results: list[Any] = [None] * world_size
    failures: list[tuple[int, str]] = []
    store = dist.HashStore()

    def worker(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
        try:
            results[rank] = fn(rank, world_size, *args)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            failures.append((rank, traceback.format_exc()))
            ProcessLocalGroup.exception_handle(exc)  # wake ranks blocked in a collective
        finally:
            dist.destroy_process_group()

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    try:
        threads = [
            threading.Thread(target=worker, args=(r,), daemon=True) for r in range(world_size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TASK_TIMEOUT_S)
        if any(t.is_alive() for t in threads):
            ProcessLocalGroup.exception_handle(TimeoutError())  # release the stuck ranks
            raise RankFailure(f"threaded ranks did not finish within {TASK_TIMEOUT_S}s")
    finally:
        _uninstall_threaded_pg()
        ProcessLocalGroup.reset()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if failures:
        rank, tb = sorted(failures)[0]
        raise RankFailure(f"rank {rank} failed:\n{tb}")
    return results


def _pool_worker(rank: int, world_size: int, init_file: str, tasks: mp.Queue, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            # Pickled here, not in the queue's feeder thread, so that an
            # unpicklable result is reported instead of silently lost.
            results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
        except BaseException:  # noqa: BLE001 - reported to the parent
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class GlooPool:
    """``world_size`` forked gloo ranks that run tasks until :meth:`close`.

    A failing or hanging task closes the pool (a rank may be stuck in a
    collective); callers create a new one.
    """

    def __init__(self, world_size: int) -> None:
        ctx = mp.get_context("fork")
        self.world_size = world_size
        self._dir = tempfile.TemporaryDirectory(prefix="coc_gloo_")
        init_file = os.path.join(self._dir.name, "init")
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results: mp.Queue = ctx.Queue()
        sys.stdout.flush()
        sys.stderr.flush()
        self._procs = [
            ctx.Process(
                target=_pool_worker,
                args=(r, world_size, init_file, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self.closed = False

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Run ``fn(rank, world_size, *args)`` on every rank; results in rank order."""
        if self.closed:
            raise RuntimeError("GlooPool is closed")
        for q in self._tasks:
            q.put((fn, args))
        results: list[Any] = [None] * self.world_size
        failures = []
        for _ in range(self.world_size):
            try:
                rank, ok, value = self._results.get(timeout=TASK_TIMEOUT_S)
            except queue.Empty:
                self.close(force=True)
                raise RankFailure(f"gloo ranks did not answer within {TASK_TIMEOUT_S}s") from None
            if ok:
                results[rank] = pickle.loads(value)
            else:
                failures.append((rank, value))
                if len(failures) == 1:
                    # Peers may be blocked in a collective the failed rank never joined.
                    self._collect_remaining(results, failures)
                    break
        if failures:
            self.close(force=True)
            # every rank's: the first rank's error may be only its peer's failure seen from the other side
            raise RankFailure("\n".join(f"rank {rank} failed:\n{tb}" for rank, tb in sorted(failures)))
        return results

    def _collect_remaining(self, results: list[Any], failures: list[tuple[int, str]]) -> None:
        try:
            while True:
                rank, ok, value = self._results.get(timeout=2.0)
                if ok:
                    results[rank] = pickle.loads(value)
                else:
                    failures.append((rank, value))
        except queue.Empty:
            pass

    def close(self, *, force: bool = False) -> None:
        """Stop the ranks (politely unless ``force``) and free the rendezvous file."""
        if self.closed:
            return
        self.closed = True
        if not force:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(10)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join()
        self._dir.cleanup()


#: ``torch.distributed`` collectives the CoC code issues (whichever exist here).
RECORDED_COLLECTIVES = (
    "all_reduce",
    "all_gather_single",
    "all_gather_into_tensor",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
)


@dataclass
class CollectiveLog:
    """Per-rank event lists: ``(name, rows)`` per launch, ``("wait", name)`` per wait,
    plus anything the test appends itself (e.g. ``("mm", rows)``)."""

    events: dict[int, list[tuple[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, event: tuple[str, Any]) -> None:
        self.events[dist.get_rank()].append(event)

    def launches(self, rank: int, name: str | None = None) -> list[tuple[str, Any]]:
        return [
            e for e in self.events[rank]
            if e[0] in RECORDED_COLLECTIVES and (name is None or e[0].startswith(name))
        ]


class _LoggedWork:
    def __init__(self, work: Any, name: str, log: CollectiveLog) -> None:
        self._work, self._name, self._log = work, name, log

    def wait(self, *args: Any) -> Any:
        self._log.add(("wait", self._name))
        return self._work.wait(*args)


@contextmanager
def record_collectives() -> Iterator[CollectiveLog]:
    """Wrap the ``torch.distributed`` collectives to log every launch and wait.

    Only calls made through the ``torch.distributed`` namespace at call time
    are seen (code that captured a function object at import is not).
    """
    log = CollectiveLog()
    saved = {name: getattr(dist, name) for name in RECORDED_COLLECTIVES if hasattr(dist, name)}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def logged(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            log.add((name, tensor.shape[0] if tensor.dim() else 0))
            work = fn(tensor, *args, **kwargs)
            return _LoggedWork(work, name, log) if kwargs.get("async_op") else work

        return logged

    for name, fn in saved.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


@dataclass(frozen=True)
class Shards:
    """What one rank feeds a TP linear layer: input, weight and bias shards, output grad."""

    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    dy: torch.Tensor


@dataclass(frozen=True)
class LinearProblem:
    """``y = x @ w.T + b`` with global ``x [s, b, h_in]``, ``w [h_out, h_in]`` and its
    float64 serial forward / backward for the output gradient ``dy``."""

    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    dy: torch.Tensor
    y: torch.Tensor
    dx: torch.Tensor
    dw: torch.Tensor
    db: torch.Tensor

    @classmethod
    def make(cls, s: int, batch: int, h_in: int, h_out: int, seed: int = 0) -> LinearProblem:
        g = torch.Generator().manual_seed(seed)
        shapes = ((s, batch, h_in), (h_out, h_in), (h_out,), (s, batch, h_out))
        x, w, b, dy = (torch.randn(*shape, dtype=torch.float64, generator=g) for shape in shapes)
        xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
        y = xr @ wr.t() + br
        y.backward(dy)
        return cls(x, w, b, dy, y.detach(), xr.grad, wr.grad, br.grad)

    def shards(self, rank: int, tp: int, layer: str, sp: bool) -> Shards:
        """Column rank r owns rows r of W (out) and, with SP, sequence shard r of x;
        Row rank r owns columns r of W (in) and the matching slice of x's hidden axis."""
        if layer == "column":
            own = _own(self.w.shape[0], rank, tp)
            x = self.x.chunk(tp)[rank] if sp else self.x
            return Shards(x, self.w[own], self.b[own], self.dy[..., own])
        own = _own(self.w.shape[1], rank, tp)
        dy = self.dy.chunk(tp)[rank] if sp else self.dy
        return Shards(self.x[..., own], self.w[:, own], self.b, dy)

    def expected(self, rank: int, tp: int, layer: str, sp: bool) -> dict[str, torch.Tensor]:
        """This rank's serial output and gradients (keys y, dx, dw, db)."""
        if layer == "column":
            own = _own(self.w.shape[0], rank, tp)
            return {
                "y": self.y[..., own],
                "dx": self.dx.chunk(tp)[rank] if sp else self.dx,
                "dw": self.dw[own],
                "db": self.db[own],
            }
        own = _own(self.w.shape[1], rank, tp)
        return {
            "y": self.y.chunk(tp)[rank] if sp else self.y,
            "dx": self.dx[..., own],
            "dw": self.dw[:, own],
            # SP: this rank's rows only; megatron all-reduces SP bias grads later
            "db": self.dy.chunk(tp)[rank].sum((0, 1)) if sp else self.db,
        }

    def assert_matches(
        self, results: list[dict[str, torch.Tensor]], tp: int, layer: str, sp: bool,
        *, rtol: float, atol: float, what: str = "",
    ) -> None:
        for rank, got in enumerate(results):
            for name, want in self.expected(rank, tp, layer, sp).items():
                torch.testing.assert_close(
                    got[name].double(), want, rtol=rtol, atol=atol,
                    msg=lambda m, r=rank, n=name: f"{what} {layer} sp={sp} tp={tp} rank {r} {n}: {m}",
                )


def _own(size: int, rank: int, tp: int) -> slice:
    shard = size // tp
    return slice(rank * shard, (rank + 1) * shard)
