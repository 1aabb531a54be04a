"""Observe (and perturb) the collectives and matmuls an implementation issues on this rank.

Two views are combined into one timeline of :class:`Event`:

* a torch dispatch mode sees every c10d and functional collective op, and every
  matmul, however the implementation called them;
* wrappers around the ``torch.distributed`` Python entry points (the current
  names and the legacy ``_all_gather_base`` / ``_reduce_scatter_base``) bind
  each call's arguments to the function's real signature, so ``async_op`` and
  ``group`` are read whether they were passed by keyword or by position; they
  also wrap the returned work handle, so the timeline shows when it was waited
  for, and record calls that never reach the dispatcher (process groups
  written in Python, such as torch's threaded one).

A functional collective (``torch.distributed._functional_collectives``) is
waited for lazily: its wait is the first later op that reads its result.

The same interception injects delays (:class:`Straggler`): before every
collective, whichever entry point reached it, so a rank can be made to arrive
late at each one.  Everything is per thread, so ranks running as threads do
not see each other.
"""

from __future__ import annotations

import functools
import inspect
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

#: torch.distributed entry points that are wrapped (those this torch has).
PY_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base",
    "all_to_all", "all_to_all_single", "broadcast", "reduce", "barrier", "all_gather_object",
    "broadcast_object_list", "gather", "scatter", "send", "recv", "isend", "irecv",
)
#: Dispatcher namespaces of collective ops.
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
#: aten ops counted as matmuls (the output shape identifies which product it was).
MATMUL_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "addbmm", "_addmm_activation", "matmul",
                        "linear", "mv", "addmv", "dot", "_int_mm", "_scaled_mm", "_weight_int8pack_mm"})
_KINDS = (("all_reduce", ("allreduce", "all_reduce")),
          ("all_gather", ("allgather", "all_gather")),
          ("reduce_scatter", ("reduce_scatter",)),
          ("all_to_all", ("alltoall", "all_to_all")))

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


@dataclass
class CollectiveCall:
    """One collective as seen on this rank."""

    op: str  #: dispatcher op (``c10d.allreduce_``, ``_c10d_functional.all_reduce``) or ``api.<name>``
    shapes: list[tuple[int, ...]]
    api: str | None = None  #: torch.distributed entry point, when called through it
    async_op: bool | None = None  #: None: unknown (neither the API nor the op schema says)
    group_ranks: tuple[int, ...] | None = None  #: global ranks of the group it ran on
    launched: int = -1  #: index of its launch in the timeline
    waited: int | None = None  #: index of its wait (None: never seen waited)

    @property
    def kind(self) -> str:
        """all_reduce / all_gather / reduce_scatter / all_to_all / other, whatever the API."""
        name = (self.api or self.op.split(".")[-1]).lower()
        for kind, keys in _KINDS:
            if any(k in name for k in keys):
                return kind
        return name

    @property
    def functional(self) -> bool:
        return self.op.startswith(("_c10d_functional", "c10d_functional"))

    @property
    def overlappable(self) -> bool:
        """Issued without blocking: ``async_op=True`` or a functional (lazy-wait) collective."""
        return self.async_op is True or self.functional


@dataclass(frozen=True)
class Event:
    """One entry of the timeline: ``launch`` / ``wait`` (of ``call``), ``matmul`` (``shape``), ``mark``."""

    what: str
    call: int | None = None
    shape: tuple[int, ...] | None = None
    label: str = ""
    op: str = ""


@dataclass
class CollectiveLog:
    calls: list[CollectiveCall] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _lazy: dict[int, int] = field(default_factory=dict)  # storage ptr of a functional result -> call

    def of_kind(self, kind: str) -> list[CollectiveCall]:
        return [c for c in self.calls if c.kind == kind]

    def __len__(self) -> int:
        return len(self.calls)

    def mark(self, label: str) -> None:
        """Put a named boundary into the timeline (e.g. between two layers' backward)."""
        self.events.append(Event("mark", label=label))

    def launch(self, call: CollectiveCall) -> int:
        call.launched = len(self.events)
        self.calls.append(call)
        index = len(self.calls) - 1
        self.events.append(Event("launch", call=index))
        if not call.overlappable:
            self.waited(index)  # a blocking call is done when it returns
        return index

    def waited(self, index: int) -> None:
        call = self.calls[index]
        if call.waited is None:
            call.waited = len(self.events)
            self.events.append(Event("wait", call=index))

    def matmuls_while_in_flight(self, index: int) -> list[Event]:
        """Matmuls that ran after collective ``index`` was launched and before it was waited for."""
        call = self.calls[index]
        end = call.waited if call.waited is not None else len(self.events)
        return [e for e in self.events[call.launched + 1:end] if e.what == "matmul"]


class _TrackedWork:
    """Marks the timeline when the work is waited for; everything else goes to the real handle."""

    def __init__(self, work: Any, log: CollectiveLog, index: int) -> None:
        self._work, self._log, self._index = work, log, index

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        self._log.waited(self._index)
        COMPLETED.note()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


@dataclass
class Straggler:
    """Delays this rank before collectives: every one (``every``) or each with ``probability``.

    ``seconds`` is the longest delay; each is drawn uniformly from ``[0, seconds]``
    with a generator seeded per rank, so a run is reproducible.
    """

    seconds: float
    seed: int = 0
    probability: float = 1.0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def __call__(self) -> None:
        if self._rng.random() < self.probability:
            time.sleep(self._rng.random() * self.seconds)


def _group_ranks(group: Any) -> tuple[int, ...] | None:
    import torch.distributed as dist

    try:
        if group is None:
            group = dist.group.WORLD
        elif type(group).__name__ == "ScriptObject":
            group = dist.ProcessGroup.unbox(group)
        return tuple(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - a group we cannot resolve is reported as unknown
        return None


def _install_api_wrappers() -> None:
    """Wrap torch.distributed's Python collectives once per process (idempotent)."""
    global _installed
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    with _install_lock:
        if _installed:
            return
        for name in PY_COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = _api_wrapper(name, original)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapped)
        _installed = True


def _api_wrapper(name: str, original: Any) -> Any:
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log: CollectiveLog | None = getattr(_local, "log", None)
        delay: Callable[[], None] | None = getattr(_local, "delay", None)
        if log is None and delay is None:
            return original(*args, **kwargs)
        stack: list[tuple[str, bool, Any]] = _local.api_stack
        outermost = not stack
        async_op, group = False, None
        if signature is not None:
            try:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                async_op = bool(bound.arguments.get("async_op", False))
                group = bound.arguments.get("group")
            except TypeError:
                pass
        if outermost and delay is not None:
            delay()
        seen = len(log.calls) if log is not None else 0
        stack.append((name, async_op, group))
        try:
            result = original(*args, **kwargs)
        finally:
            stack.pop()
        if outermost and not async_op:
            COMPLETED.note()
        if log is None or not outermost:
            return result
        if len(log.calls) == seen:  # the dispatcher never saw it (a process group written in Python)
            log.launch(CollectiveCall(f"api.{name}", _shapes(args), name, async_op, _group_ranks(group)))
        index = len(log.calls) - 1
        if async_op and result is not None and index >= seen:
            return _TrackedWork(result, log, index)
        return result

    return wrapper


@contextmanager
def record_collectives(delay: Callable[[], None] | None = None) -> Iterator[CollectiveLog]:
    """Record every collective and matmul this thread issues inside the block.

    ``delay`` (e.g. a :class:`Straggler`) is called before every collective.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    _install_api_wrappers()
    log = CollectiveLog()

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if log._lazy:
                _note_lazy_waits(log, args, kwargs)
            if func.namespace in COLLECTIVE_NAMESPACES:
                if "wait" in func._opname:
                    _note_lazy_waits(log, args, kwargs)
                    return func(*args, **kwargs)
                stack = _local.api_stack
                if not stack and delay is not None:
                    delay()
                call = _dispatched_call(func, args, kwargs, stack)
                out = func(*args, **kwargs)
                index = log.launch(call)
                if call.functional:
                    for ptr in _storages(out):
                        log._lazy[ptr] = index
                return out
            out = func(*args, **kwargs)
            if func._opname in MATMUL_OPS:
                shape = tuple(out.shape) if hasattr(out, "shape") else None
                log.events.append(Event("matmul", shape=shape, op=f"{func.namespace}.{func._opname}"))
            elif func.namespace not in ("aten", "prim", "prims") and _fused_name(func._opname):
                log.events.append(Event("matmul", shape=tuple(getattr(out, "shape", ()) or ()),
                                        label="fused", op=f"{func.namespace}.{func._opname}"))
            return out

    previous = (getattr(_local, "log", None), getattr(_local, "api_stack", None), getattr(_local, "delay", None))
    _local.log, _local.api_stack, _local.delay = log, [], delay
    try:
        with _Mode():
            yield log
    finally:
        _local.log, _local.api_stack, _local.delay = previous


def _dispatched_call(func: Any, args: Any, kwargs: Any, stack: list[tuple[str, bool, Any]]) -> CollectiveCall:
    schema = func._schema.arguments
    values = dict(zip((a.name for a in schema), args))
    values.update(kwargs)
    async_op: bool | None
    if stack:  # called through torch.distributed: the user's own arguments say it all
        api, async_op, group = stack[0]
        ranks = _group_ranks(group)
    else:
        api = None
        defaults = {a.name: a.default_value for a in schema if a.has_default_value()}
        flag = values.get("async_op", defaults.get("async_op"))
        async_op = None if flag is None else bool(flag)
        group = values["process_group"] if "process_group" in values else values.get("group_name")
        ranks = _functional_ranks(group) if isinstance(group, str) else _group_ranks(group)
    return CollectiveCall(f"{func.namespace}.{func._opname}", _shapes(args), api, async_op, ranks)


def _functional_ranks(group_name: str) -> tuple[int, ...] | None:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _group_ranks(_resolve_process_group(group_name))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        return None


def _fused_name(name: str) -> bool:
    """A vendor op that multiplies and communicates in one (e.g. torch_npu's MC2 kernels)."""
    lowered = name.lower()
    return ("mm" in lowered or "matmul" in lowered) and any(
        k in lowered for k in ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter"))


def _storages(value: Any) -> list[int]:
    import torch

    items = value if isinstance(value, (list, tuple)) else [value]
    found = []
    for item in items:
        if isinstance(item, torch.Tensor):
            try:
                found.append(item.untyped_storage().data_ptr())
            except Exception:  # noqa: BLE001 - a tensor subclass without storage
                pass
    return found


def _note_lazy_waits(log: CollectiveLog, args: Any, kwargs: Any) -> None:
    for value in [*args, *kwargs.values()]:
        for ptr in _storages(value):
            index = log._lazy.pop(ptr, None)
            if index is not None:
                log.waited(index)
                COMPLETED.note()


def _shapes(args: Any) -> list[tuple[int, ...]]:
    import torch

    found: list[tuple[int, ...]] = []
    for arg in args:
        items = arg if isinstance(arg, (list, tuple)) else [arg]
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append(tuple(item.shape))
            elif isinstance(item, (list, tuple)):
                found.extend(tuple(t.shape) for t in item if isinstance(t, torch.Tensor))
    return found


# --- progress evidence: collectives seen completing (the case clock's second evidence) ------------------------


@dataclass
class CompletionCount:
    """Collectives this process saw complete while recording; ``listener`` hears each new count.

    A rank reports it in its progress messages
    (:mod:`conformance.harness.launchers.worker`), so that
    :class:`~conformance.harness.case_clock.CaseClock` does not take a rank
    blocked in a slow collective that completes (it uses no CPU) for a hung one.
    """

    count: int = 0
    listener: Callable[[int], None] | None = None

    def note(self) -> None:
        self.count += 1
        if self.listener is not None:
            self.listener(self.count)


COMPLETED = CompletionCount()
