"""A rank task: a picklable function run on every rank of a case, and its outcome.

Checks write rank-side code as plain module-level functions ``fn(ctx, **params)``;
they never know how ranks are launched.  Each rank returns a picklable value (or
raises); the launcher collects one :class:`RankOutcome` per rank.

While it runs, a task may say how long the rest of it may take
(:meth:`RankContext.expect_within`): once that budget is spent and its ranks
no longer progress, the launcher declares a hang instead of waiting for the
case's ceiling (:mod:`conformance.harness.case_clock`,
``docs/DESIGN.md#time-budget``).  It times its own phases with
:meth:`RankContext.timer`, so the report can tell the implementation's time from
the suite's references.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from conformance.contract.rank_errors import CapturedError
from conformance.harness import rank_threads
from conformance.harness.captured_calls import Tee, exits_raise

#: ``timer`` kinds: the implementation under test, and the suite's own references.
IMPL, REFERENCE = "impl", "reference"


@dataclass(frozen=True)
class Budget:
    """How long a case may take: ``floor + factor * (serial seconds)`` after its serial reference ran.

    ``docs/DESIGN.md#time-budget``: a hang in a 0.1 s case is declared in
    seconds, not at the ceiling (``--coc-case-timeout``); a case whose ranks
    still use CPU time when it is spent runs on, up to the ceiling.
    """

    factor: float = 20.0
    floor: float = 10.0

    def seconds(self, serial_s: float, calls: int = 1) -> float:
        return self.floor + self.factor * serial_s * max(1, calls)


@dataclass
class RankContext:
    """What a rank knows while it runs a task."""

    rank: int
    world_size: int
    device: str
    impl_spec: str
    launcher: str
    subgroup: Any = None  # set when the task runs on part of a larger world (torchrun)
    #: Called with a number of seconds: the rest of the task must finish within it.
    on_budget: Callable[[float], None] | None = None
    budget: Budget | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: Whether a CPU rank runs each backward on another thread, as an accelerator's autograd engine does
    #: (:func:`backward`; ``--coc-same-thread-backward`` turns it off).
    device_thread_backward: bool = True

    @property
    def impl(self) -> Any:
        """The implementation under test, loaded once per rank process."""
        from conformance.harness.impl_loader import load_implementation

        return load_implementation(self.impl_spec)

    @property
    def group(self) -> Any:
        """The process group spanning the task's ranks."""
        import torch.distributed as dist

        return self.subgroup if self.subgroup is not None else dist.group.WORLD

    def expect_within(self, seconds: float) -> None:
        """From now on the task must finish within ``seconds``, or be still progressing (else it is a hang)."""
        if self.on_budget is not None:
            self.on_budget(float(seconds))

    def budget_from(self, serial_s: float, calls: int = 1) -> None:
        """The rest of the task runs ``calls`` implementation calls whose serial path took ``serial_s``."""
        if self.budget is not None:
            self.expect_within(self.budget.seconds(serial_s, calls))

    @contextlib.contextmanager
    def timer(self, kind: str, *, synchronized: bool = True) -> Iterator[None]:
        """Add the block's wall time to ``timings[kind]`` (:data:`IMPL` or :data:`REFERENCE`).

        ``synchronized``: the device is synchronised at the block's edges
        (:func:`synchronize`), so work queued before it is not the block's and
        work the block queued is.  Off where the case's own rule forbids a
        synchronisation (the op calls made back to back): the block then times
        what was queued.
        """
        if synchronized:
            synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if synchronized:
                synchronize(self.device)
            self.timings[kind] = self.timings.get(kind, 0.0) + time.perf_counter() - start

    def backward(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (a backward) as this rank's device runs one: on a CPU rank, on the rank's device thread,
        carrying this one's thread-local state (:func:`conformance.harness.device_thread.run_backward`)."""
        from conformance.harness.device_thread import run_backward

        return run_backward(fn, device=self.device, off_thread=self.device_thread_backward, rank=self.rank)


TaskFn = Callable[..., Any]


@dataclass(frozen=True)
class RankTask:
    """A function and parameters to run on ``world_size`` ranks.

    ``timeout`` is the ceiling; a task may lower it while it runs
    (:meth:`RankContext.expect_within`).
    """

    fn: TaskFn
    world_size: int
    params: dict[str, Any] = field(default_factory=dict)
    timeout: float = 60.0
    exclusive: bool = False
    budget: Budget | None = None
    device_thread_backward: bool = True  #: :attr:`RankContext.device_thread_backward` of its ranks
    #: Run on ranks that ran no case before (a launcher whose ``relaunches`` is true starts new ones): what a
    #: process fixes at its first call (a plan, a cache) is fixed anew, as in another job.
    fresh: bool = False
    #: ``(fn, params)`` as :func:`conformance.harness.wire.dumps` wrote them in the process that made the task
    #: (``params`` then empty): a rank server forwards them to the ranks unread, never importing what they hold.
    call: bytes | None = None

    @property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def pickled_call(self) -> bytes:
        """``(fn, params)`` pickled, as every rank reads them."""
        from conformance.harness import wire

        return self.call if self.call is not None else wire.dumps((self.fn, self.params))

    def pickled(self) -> RankTask:
        """The task with its call pickled already (:attr:`call`), as it is sent to a rank server."""
        return self if self.call is not None else replace(self, params={}, call=self.pickled_call())


@dataclass
class RankOutcome:
    """One rank's result: a value or an error, what the rank logged, and its phase timings."""

    rank: int
    value: Any = None
    error: CapturedError | None = None
    log: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    #: Calls of torch_npu's fused kernels the implementation's calls reached, by kernel (:mod:`.probes`).
    fused_kernels: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


def run_on_rank(
    task_fn: TaskFn, params: dict[str, Any], ctx: RankContext, *, capture_stdio: bool = True,
    carry: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
) -> RankOutcome:
    """Run one task on this rank, capturing its output, logs, timings, fused kernel calls and exception.

    Ranks that are threads of one process share ``sys.stdout``; they pass
    ``capture_stdio=False`` and only their threads' log records are kept.
    The calling thread is the rank's task thread while the task runs
    (:func:`conformance.harness.rank_threads.rank_thread`; ``carry``: the
    context a helper thread of the rank runs the rank's code in).
    """
    from conformance.harness import probes
    from conformance.harness.completions import FUSED_CALLS

    probes.install()  # (once per process; a callback the task registers before it records is then watched)
    buffer = io.StringIO()
    ctx.timings = {}
    me = threading.get_ident()  # the rank thread its recordings count for
    fused = FUSED_CALLS.of_rank(me)
    with rank_threads.rank_thread(carry), _capture_output(buffer, capture_stdio), exits_raise():
        try:
            value = task_fn(ctx, **params)
            error = None
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            value, error = None, CapturedError.capture(exc)
    return RankOutcome(rank=ctx.rank, value=value, error=error, log=buffer.getvalue(),
                       timings=dict(ctx.timings), fused_kernels=FUSED_CALLS.since(fused, me))


@contextlib.contextmanager
def _capture_output(buffer: io.StringIO, capture_stdio: bool) -> Iterator[None]:
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    own_thread = threading.get_ident()
    handler.addFilter(lambda record: record.thread is None or rank_threads.works_for(record.thread, own_thread))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        if capture_stdio:
            # Tee, so that what a rank printed survives in its process output if it dies.
            with contextlib.redirect_stdout(Tee(buffer, sys.stdout)), \
                    contextlib.redirect_stderr(Tee(buffer, sys.stderr)):
                yield
        else:
            yield
    finally:
        root.removeHandler(handler)


def synchronize(device: str) -> None:
    """Wait for the work queued on ``device`` (``cuda:N``, ``npu:N``) to finish; nothing on the CPU.

    Device kernels run asynchronously: a block timed without it measures
    what was queued, not what ran.  Never starts a runtime the rank has not.
    """
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "npu"):
        return
    torch = sys.modules.get("torch")
    runtime = getattr(torch, kind, None) if torch is not None else None
    try:
        if runtime is not None and runtime.is_initialized():
            runtime.synchronize(int(index or 0))
    except Exception:  # noqa: BLE001 - a device error is the task's to report, not the timer's
        pass
