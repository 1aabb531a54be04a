"""Observe (and perturb) the collectives and matmuls an implementation issues on this rank.

Every call style meets in the dispatcher, so that is where collectives are
recorded (``docs/DESIGN.md#overlap-structure``):

* a torch dispatch mode sees every c10d op (``c10d.allreduce_``,
  ``c10d._allgather_base_`` ...) and functional collective, however the
  implementation reached it -- ``torch.distributed.all_reduce``, a name bound
  at its own import (``from torch.distributed import all_reduce``), a module
  alias, a wrapper -- and keeps the ``Work`` each returns;
* ``Work.wait`` (and a ``Work.is_completed`` that answers True) is patched on
  the class, once per process, so waiting on any handle of a recorded launch
  is seen, whoever holds it; a functional collective is waited for by
  ``wait_tensor``, or lazily at the first later op that reads its result;
* wrappers around the ``torch.distributed`` Python entry points bind each
  call's arguments to the function's real signature (``async_op`` and
  ``group`` by keyword or position), and record calls that never reach the
  dispatcher (process groups written in Python, such as torch's threaded one),
  whose handles they wrap.

Each collective's group is resolved to global ranks when it is launched; a
group that no longer exists (destroyed, or left over from an earlier case) is
resolved from the groups seen alive at earlier recordings and marked so.

A matmul is identified by what it multiplies: tensors named with
:meth:`CollectiveLog.name_operand` (a layer's weight) carry their name through
every op that derives a tensor from them (views, copies, casts, gathers), and a
matmul records the names its operands carry.

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
    "broadcast_object_list", "gather", "scatter", "send", "recv",
)  # not isend / irecv: torch compares them by identity (``P2POp``), so a wrapper would break an implementation
#    holding the original; their collectives are seen in the dispatcher
#: Ops of the collective namespaces that are no collective.
NOT_COLLECTIVES = frozenset({"_wrap_tensor_autograd"})
#: Dispatcher namespaces of collective ops.
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
#: aten ops counted as matmuls.
MATMUL_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "addbmm", "_addmm_activation", "matmul",
                        "linear", "mv", "addmv", "dot", "_int_mm", "_scaled_mm", "_weight_int8pack_mm"})
_KINDS = (("all_reduce", ("allreduce", "all_reduce")),
          ("all_gather", ("allgather", "all_gather")),
          ("reduce_scatter", ("reduce_scatter",)),
          ("all_to_all", ("alltoall", "all_to_all")))
#: Group states: resolved while it exists, resolved from an earlier recording (it no longer exists), unknown.
LIVE, GONE, UNKNOWN = "live", "gone", "unknown"

_local = threading.local()
_install_lock = threading.Lock()
#: Thread ident -> the log it is recording into, for every thread recording now (a collective issued by another
#: thread of the process is noted there: a helper thread's collectives are not recorded, and a reader must know).
_recording: dict[int, CollectiveLog] = {}
_installed = False
_waits_patched = False  #: whether Work's waits are patched (counting completions; :func:`count_completions`)
#: Process group name -> its global ranks, for every group seen alive at a recording (groups are named once).
_known_groups: dict[str, tuple[int, ...]] = {}


@dataclass
class CollectiveCall:
    """One collective as seen on this rank."""

    op: str  #: dispatcher op (``c10d.allreduce_``, ``_c10d_functional.all_reduce``) or ``api.<name>``
    shapes: list[tuple[int, ...]]
    api: str | None = None  #: torch.distributed entry point, when called through it
    async_op: bool | None = None  #: None: unknown (neither the API nor the op schema says)
    group_ranks: tuple[int, ...] | None = None  #: global ranks of the group it ran on
    group_state: str = LIVE  #: :data:`LIVE`, :data:`GONE` (the group no longer existed) or :data:`UNKNOWN`
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
    """One entry of the timeline: ``launch`` / ``wait`` (of ``call``), ``matmul``, ``mark``, ``other_thread`` (a
    collective another thread issued, by entry point ``label``: not recorded).

    A matmul has its output ``shape`` and the ``operands``: the names its
    inputs carry (:meth:`CollectiveLog.name_operand`).
    """

    what: str
    call: int | None = None
    shape: tuple[int, ...] | None = None
    label: str = ""
    op: str = ""
    operands: frozenset[str] = frozenset()


@dataclass
class CollectiveLog:
    calls: list[CollectiveCall] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: (event index, entry point) of each collective another thread issued while this one recorded: not recorded
    other_threads: list[tuple[int, str]] = field(default_factory=list)
    _lazy: dict[int, int] = field(default_factory=dict)  # storage ptr of a functional result -> call
    #: id(Work or Future) -> (it, kept alive; the calls waiting on it completes)
    _works: dict[int, tuple[Any, tuple[int, ...]]] = field(default_factory=dict)
    _names: dict[int, tuple[Any, frozenset[str]]] = field(default_factory=dict)  # storage ptr -> (storage; names)

    def of_kind(self, kind: str) -> list[CollectiveCall]:
        return [c for c in self.calls if c.kind == kind]

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def completed(self) -> int:
        """How many collectives this rank has seen complete (waited for, or blocking and returned)."""
        return sum(1 for c in self.calls if c.waited is not None)

    def mark(self, label: str) -> None:
        """Put a named boundary into the timeline (e.g. between two layers' backward)."""
        self.events.append(Event("mark", label=label))

    def name_operand(self, name: str, tensor: Any) -> None:
        """Name ``tensor`` (and everything later derived from it) for the matmuls that multiply it."""
        _name_storages(self, [tensor], frozenset({name}))

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
            COMPLETED.note()

    def matmuls_while_in_flight(self, index: int, end: int | None = None) -> list[Event]:
        """Matmuls that ran after collective ``index`` was launched and before it was waited for -- or, never
        seen waited, before ``end`` (the end of the phase it belongs to; default: of the recording)."""
        call = self.calls[index]
        bound = len(self.events) if end is None else end
        stop = min(call.waited, bound) if call.waited is not None else bound
        return [e for e in self.events[call.launched + 1:stop] if e.what == "matmul"]

    def _work_waited(self, work: Any) -> None:
        entry = self._works.get(id(work))
        if entry is not None and entry[0] is work:
            del self._works[id(work)]
            for index in entry[1]:
                self.waited(index)

    def _waits_for(self, handle: Any, calls: tuple[int, ...]) -> None:
        """Waiting on ``handle`` (a Work, or a Future) completes ``calls``."""
        if calls:
            self._works[id(handle)] = (handle, calls)

    def _calls_of(self, work: Any) -> tuple[int, ...]:
        entry = self._works.get(id(work))
        return entry[1] if entry is not None and entry[0] is work else ()


class _TrackedWork:
    """The handle of a call the dispatcher never saw: marks the timeline when waited for (``wait``, ``synchronize``,
    ``result``, or the future it gives)."""

    def __init__(self, work: Any, log: CollectiveLog, index: int) -> None:
        self._work, self._log, self._index = work, log, index

    def _done(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._work, method)(*args, **kwargs)
        self._log.waited(self._index)
        return result

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._done("wait", *args, **kwargs)

    def synchronize(self, *args: Any, **kwargs: Any) -> Any:
        return self._done("synchronize", *args, **kwargs)

    def result(self, *args: Any, **kwargs: Any) -> Any:
        return self._done("result", *args, **kwargs)

    def get_future(self) -> Any:
        future = self._work.get_future()
        self._log._waits_for(future, (self._index,))
        return future

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


def _remember_live_groups() -> None:
    """Note every group that exists now, so a collective on it after it is destroyed still names its ranks."""
    try:
        import torch.distributed.distributed_c10d as c10d

        for group, ranks in c10d._world.pg_group_ranks.items():
            _known_groups[group.group_name] = tuple(ranks)
    except Exception:  # noqa: BLE001 - no default group yet, or another torch's internals: nothing to remember
        pass


def _group_ranks(group: Any) -> tuple[tuple[int, ...] | None, str]:
    """The global ranks of ``group`` (None: WORLD) and whether it still exists (:data:`LIVE` ...)."""
    import torch.distributed as dist

    try:
        if group is None:
            group = dist.group.WORLD
        elif type(group).__name__ == "ScriptObject":
            group = dist.ProcessGroup.unbox(group)
    except Exception:  # noqa: BLE001 - a group we cannot resolve is reported as unknown
        return None, UNKNOWN
    try:
        return tuple(dist.get_process_group_ranks(group)), LIVE
    except Exception:  # noqa: BLE001 - destroyed, or never registered: try the groups seen alive before
        known = _known_groups.get(getattr(group, "group_name", None) or "")
        return known, (GONE if known is not None else UNKNOWN)


def count_completions() -> None:
    """Patch ``Work``'s and ``Future``'s waits on the class, once per process: every wait that returns counts in
    :data:`COMPLETED`.

    So does every rendezvous of a group creation (torch's private helpers:
    Megatron creates 20 or more groups a case, and on a loaded machine that
    takes seconds with no ``Work`` at all).  Cheap (one counter), and in force
    from then on, recording or not: the case clock's evidence
    (``docs/DESIGN.md#progress-evidence``).  No public torch.distributed
    function changes identity.
    """
    global _waits_patched
    import torch
    import torch.distributed as dist

    with _install_lock:
        if _waits_patched:
            return
        _patch_waits(dist.distributed_c10d.Work)
        _patch_waits(torch._C.Future, ("wait", "value"))
        for name in _RENDEZVOUS:
            original = getattr(dist.distributed_c10d, name, None)
            if original is not None:
                setattr(dist.distributed_c10d, name, _counted(original))
        _waits_patched = True


#: torch's private steps of creating a process group: store rendezvous every member completes (each counts).
_RENDEZVOUS = ("_new_process_group_helper", "_store_based_barrier")


def _counted(original: Any) -> Any:
    """``original``, counting each return in :data:`COMPLETED` (a group creation is a rendezvous of its ranks)."""

    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        COMPLETED.note()
        return result

    return counted


def _install() -> None:
    """Patch ``Work``'s waits and wrap torch.distributed's Python collectives, once per process."""
    global _installed
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    count_completions()
    with _install_lock:
        if _installed:
            return
        original_get_future = dist.distributed_c10d.Work.get_future

        def get_future(self: Any) -> Any:
            future = original_get_future(self)
            log: CollectiveLog | None = getattr(_local, "log", None)
            if log is not None:
                log._waits_for(future, log._calls_of(self))
            return future

        dist.distributed_c10d.Work.get_future = get_future  # type: ignore[method-assign]
        original_wait_all = torch.futures.wait_all

        @functools.wraps(original_wait_all)
        def wait_all(futures: Any) -> Any:
            result = original_wait_all(futures)
            log: CollectiveLog | None = getattr(_local, "log", None)
            for future in futures if log is not None else ():
                log._work_waited(future)  # type: ignore[union-attr]
            return result

        torch.futures.wait_all = wait_all
        c10d._coalescing_manager = _coalescing(c10d._coalescing_manager)
        for name in PY_COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = _api_wrapper(name, original)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapped)
        _installed = True


def _patch_waits(cls: Any, methods: tuple[str, ...] = ("wait", "synchronize", "result", "is_completed")) -> None:
    """Patch each of ``methods`` on ``cls`` (a Work, a Future) so that a handle waited on through it marks the
    calls it completes waited (``is_completed`` only when it answers True), and every wait that returns counts in
    :data:`COMPLETED` (a poll of ``is_completed`` does not: polling a finished handle again is no new progress)."""
    for method in methods:
        original = getattr(cls, method, None)
        if original is None:
            continue

        def patched(self: Any, *args: Any, _original: Any = original, _method: str = method, **kwargs: Any) -> Any:
            result = _original(self, *args, **kwargs)
            log: CollectiveLog | None = getattr(_local, "log", None)
            if log is not None and (_method != "is_completed" or result):
                log._work_waited(self)
            if _method != "is_completed":
                COMPLETED.note()
            return result

        setattr(cls, method, patched)


def _coalescing(original: Any) -> Any:
    """``_coalescing_manager`` that counts each collective inside it once, and waited when the manager's handle is
    (``cm.wait()``, which replaces the handles of the calls inside; ``batch_isend_irecv`` takes this path)."""
    @contextmanager
    @functools.wraps(original)
    def manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
        log: CollectiveLog | None = getattr(_local, "log", None)
        start = len(log.calls) if log is not None else 0
        with original(*args, **kwargs) as cm:
            yield cm
        if log is None:
            return
        inside = tuple(range(start, len(log.calls)))
        for work in getattr(cm, "works", ()):
            log._waits_for(work, inside)
        if not getattr(cm, "works", ()):  # not async: the manager waited (or the backend synchronised) on exit
            for index in inside:
                log.waited(index)

    manager._coalescing_probe = True  # type: ignore[attr-defined]
    return manager


def _note_other_thread(name: str) -> None:
    """A collective from a thread that has never recorded, while exactly one thread records (a rank's helper
    thread): noted in that recording, whose structure then cannot be judged.  Ranks running as threads (several
    recording) are not told apart, so nothing is noted then."""
    if len(_recording) == 1 and not getattr(_local, "recorded", False):
        for log in list(_recording.values()):
            log.other_threads.append((len(log.events), name))
            log.events.append(Event("other_thread", label=name))


def _coalescing_now(group: Any) -> bool:
    """Whether ``group`` (None: the default) is inside ``_coalescing_manager``: a collective called now is only
    queued, and is issued (and recorded) once, coalesced, on the manager's exit."""
    try:
        import torch.distributed.distributed_c10d as c10d

        state = c10d._world.pg_coalesce_state
        return bool(state) and (group or c10d._get_default_group()) in state
    except Exception:  # noqa: BLE001 - no default group, or another torch's internals
        return False


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
            _note_other_thread(name)
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
        if log is None or not outermost or len(log.calls) > seen or _coalescing_now(group):
            return result  # the dispatcher saw it (its Work's wait is seen on the class), or it is only queued
        index = log.launch(CollectiveCall(f"api.{name}", _shapes(args), name, async_op, *_group_ranks(group)))
        return _TrackedWork(result, log, index) if async_op and result is not None else result

    wrapper._coc_probe = True  # type: ignore[attr-defined]  # the original is ``__wrapped__``
    return wrapper


@contextmanager
def record_collectives(delay: Callable[[], None] | None = None) -> Iterator[CollectiveLog]:
    """Record every collective and matmul this thread issues inside the block.

    ``delay`` (e.g. a :class:`Straggler`) is called before every collective.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    _install()
    _remember_live_groups()
    log = CollectiveLog()

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if log._lazy:
                _note_lazy_waits(log, args, kwargs)
            names = _names_of(log, args, kwargs) if log._names else frozenset()
            if func.namespace in COLLECTIVE_NAMESPACES and func._opname not in NOT_COLLECTIVES:
                if "wait" in func._opname:
                    _note_lazy_waits(log, args, kwargs)
                    return func(*args, **kwargs)
                stack = _local.api_stack
                if not stack and delay is not None:
                    delay()
                call = _dispatched_call(func, args, kwargs, stack)
                out = func(*args, **kwargs)
                index = log.launch(call)
                for work in _works(out):
                    log._waits_for(work, (index,))
                if call.functional:
                    for ptr in _storages(out):
                        log._lazy[ptr] = index
            elif func._opname in MATMUL_OPS:
                out = func(*args, **kwargs)
                shape = tuple(out.shape) if hasattr(out, "shape") else None
                log.events.append(Event("matmul", shape=shape, op=f"{func.namespace}.{func._opname}",
                                        operands=names))
                return out
            else:
                out = func(*args, **kwargs)
                if func.namespace not in ("aten", "prim", "prims") and _fused_name(func._opname):
                    log.events.append(Event("matmul", shape=tuple(getattr(out, "shape", ()) or ()),
                                            label="fused", op=f"{func.namespace}.{func._opname}", operands=names))
            if names:
                _name_storages(log, [out, *_written(func, args, kwargs)], names)
            return out

    previous = (getattr(_local, "log", None), getattr(_local, "api_stack", None), getattr(_local, "delay", None))
    _local.log, _local.api_stack, _local.delay, _local.recorded = log, [], delay, True
    thread = threading.get_ident()
    outer = _recording.get(thread)
    _recording[thread] = log
    try:
        with _Mode():
            yield log
    finally:
        _local.log, _local.api_stack, _local.delay = previous
        if outer is None:
            _recording.pop(thread, None)
        else:
            _recording[thread] = outer


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
    return CollectiveCall(f"{func.namespace}.{func._opname}", _shapes(args), api, async_op, *ranks)


def _functional_ranks(group_name: str) -> tuple[tuple[int, ...] | None, str]:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _group_ranks(_resolve_process_group(group_name))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        known = _known_groups.get(group_name)
        return known, (GONE if known is not None else UNKNOWN)


def _works(out: Any) -> list[Any]:
    """The ``Work`` handles an op returned, as the Python objects its callers will hold.

    The probe keeps each one alive, so unboxing gives the very object a
    caller waits on (one Python object per live handle).
    """
    from torch.distributed.distributed_c10d import Work

    found = []
    for item in out if isinstance(out, (list, tuple)) else [out]:
        if type(item).__name__ == "ScriptObject":
            try:
                found.append(Work.unbox(item))
            except Exception:  # noqa: BLE001 - another script object (not a Work)
                pass
    return found


def _fused_name(name: str) -> bool:
    """A vendor op that multiplies and communicates in one (e.g. torch_npu's MC2 kernels)."""
    lowered = name.lower()
    return ("mm" in lowered or "matmul" in lowered) and any(
        k in lowered for k in ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter"))


def _tensors(value: Any) -> Iterator[Any]:
    from torch import Tensor

    if isinstance(value, Tensor):
        yield value
        return
    if not isinstance(value, (list, tuple)):
        return
    for item in value:
        if isinstance(item, Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from (t for t in item if isinstance(t, Tensor))


def _storage(tensor: Any) -> Any:
    try:
        return tensor.untyped_storage()
    except Exception:  # noqa: BLE001 - a tensor subclass without storage
        return None


def _storage_key(tensor: Any) -> int:
    """The address of ``tensor``'s storage, from its own (no storage object is made: this runs on every op)."""
    try:
        return int(tensor.data_ptr() - tensor.storage_offset() * tensor.element_size())
    except Exception:  # noqa: BLE001 - a tensor subclass without storage
        return 0


def _storages(value: Any) -> list[int]:
    return [key for key in map(_storage_key, _tensors(value)) if key]


def _names_of(log: CollectiveLog, args: Any, kwargs: Any) -> frozenset[str]:
    """The names an op's tensor arguments carry (this runs on every op while a name is given: kept lean)."""
    names: frozenset[str] = frozenset()
    known = log._names
    for value in (*args, *kwargs.values()) if kwargs else args:
        for tensor in _tensors(value):
            entry = known.get(_storage_key(tensor))
            if entry is not None:
                names |= entry[1]
    return names


def _name_storages(log: CollectiveLog, values: list[Any], names: frozenset[str]) -> None:
    """Give ``names`` to the storages of ``values`` (kept alive while recording, so no address is reused)."""
    for value in values:
        for tensor in _tensors(value):
            storage = _storage(tensor)
            if storage is None or storage.nbytes() == 0:
                continue
            ptr = storage.data_ptr()
            entry = log._names.get(ptr)
            log._names[ptr] = (storage, names | (entry[1] if entry else frozenset()))


def _written(func: Any, args: Any, kwargs: Any) -> list[Any]:
    """The arguments an op writes into (``out=``, in-place, a collective's output buffers)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = kwargs.get(argument.name, args[index] if index < len(args) else None)
            if value is not None:
                written.append(value)
    return written


def _note_lazy_waits(log: CollectiveLog, args: Any, kwargs: Any) -> None:
    for value in [*args, *kwargs.values()]:
        for ptr in _storages(value):
            index = log._lazy.pop(ptr, None)
            if index is not None:
                log.waited(index)


def _shapes(args: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for arg in args for t in _tensors(arg)]


# --- progress evidence: collectives seen completing (the case clock's second evidence) ------------------------


@dataclass
class CompletionCount:
    """Collectives this process saw complete, in all and per thread; counted always once :func:`count_completions` ran.

    A rank reports its count in its progress evidence
    (:mod:`conformance.harness.progress`), so that
    :class:`~conformance.harness.case_clock.CaseClock` does not take a rank
    blocked in a slow collective that completes (it uses no CPU) for a hung
    one.  Each wait that returns counts (a blocking call waits too); inside a
    recording a completion the timeline sees otherwise (a functional wait, a
    poll answering True) counts as well, so one completion may count twice:
    the count is evidence that something completed, not how many did.
    """

    count: int = 0
    by_thread: dict[int, int] = field(default_factory=dict)

    def note(self) -> None:
        self.count += 1
        thread = threading.get_ident()
        self.by_thread[thread] = self.by_thread.get(thread, 0) + 1

    def of_thread(self, thread_id: int) -> int:
        return self.by_thread.get(thread_id, 0)


COMPLETED = CompletionCount()
