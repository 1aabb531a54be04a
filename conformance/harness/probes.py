"""Observe (and perturb) the collectives and matmuls an implementation issues on this rank, on every thread.

Every call style meets in the dispatcher, so that is where collectives are
recorded (``docs/DESIGN.md#overlap-structure``):

* a torch dispatch mode sees every c10d op (``c10d.allreduce_``,
  ``c10d._allgather_base_`` ...) and functional collective, however the
  implementation reached it -- ``torch.distributed.all_reduce``, a name bound
  at its own import (``from torch.distributed import all_reduce``), a module
  alias, a wrapper -- and keeps the ``Work`` each returns;
* every documented wait is patched on its class, once per process, so that
  waiting on any handle of a recorded launch is seen, whoever holds it and on
  whichever thread: ``Work.wait`` / ``synchronize`` / ``result``,
  ``Future.wait`` / ``value``, a poll of ``Work.is_completed`` or
  ``Future.done`` that answers True, the future of ``get_future()``, of
  ``then(...)`` and of ``torch.futures.collect_all`` (and so ``wait_all``),
  the coalescing manager's ``wait``; a functional collective is waited for by
  ``wait_tensor``, or lazily at the first later op that reads its result;
* wrappers around the ``torch.distributed`` Python entry points bind each
  call's arguments to the function's real signature (``async_op`` and
  ``group`` by keyword or position), and record calls that never reach the
  dispatcher (process groups written in Python, such as torch's threaded one),
  whose handles they wrap.

The recording travels with PyTorch's own thread-local state, not Python's:
the code under test finds it through the dispatch-mode stack (the mode the
recording pushed), which the autograd engine carries to an accelerator's
device thread (and :mod:`conformance.harness.device_thread` to the CPU's
emulated one).  A thread that carries the mode is recorded like the thread
that recorded; per-thread scratch (the nesting of entry points) is kept per
thread under the recording.  A ``then`` / ``add_done_callback`` callback
registered inside a recording runs with its mode, on whichever thread completes
the future.  What no mode reaches -- a helper thread, or a callback registered
outside the recording, that issues a collective or multiplies -- is noted in
the recordings of its rank, naming the thread: their structure is then not
judged, never judged on an incomplete timeline.

Each collective's group is resolved to global ranks when it is launched; a
group that no longer exists (destroyed, or left over from an earlier case) is
resolved from the groups seen alive at earlier recordings and marked so.

A matmul is identified by what it multiplies: tensors named with
:meth:`CollectiveLog.name_operand` (a layer's weight) carry their name through
every op that derives a tensor from them (views, copies, casts, gathers), and a
matmul records the names its operands carry.

The same interception injects delays (:class:`Straggler`): before every
collective, whichever entry point and thread reached it, so a rank can be made
to arrive late at each one.  Ranks running as threads record apart: each
recording is its own rank's (:mod:`conformance.harness.rank_threads`).
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from conformance.harness import rank_threads
from conformance.harness.completions import COMPLETED, FUSED_CALLS
from conformance.harness.operands import (
    name_storages,
    names_of,
    note_lazy_waits,
    shapes,
    storage_keys,
    written_arguments,
)

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
#: torch_npu's fused matmul + communication kernels (MC²), as Ascend/op-plugin registers them
#: (``op_plugin/config/op_plugin_functions.yaml``) under ``torch.ops.npu``: each call inside a recording (an
#: implementation's calls) counts for its rank (:data:`FUSED_CALLS`), so a run says which fused backend ran.
FUSED_KERNEL_NAMESPACE = "npu"
FUSED_KERNELS = frozenset({
    "npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base", "npu_all_gather_base_mm",
    "npu_quant_mm_reduce_scatter", "npu_all_gather_quant_mm", "npu_all_to_all_matmul", "npu_matmul_all_to_all",
    "npu_all_to_all_quant_matmul", "npu_quant_matmul_all_to_all", "npu_alltoallv_gmm", "npu_gmm_alltoallv",
    "npu_alltoallv_quant_gmm", "npu_quant_gmm_alltoallv",
})
#: Group states: resolved while it exists, resolved from an earlier recording (it no longer exists), unknown.
LIVE, GONE, UNKNOWN = "live", "gone", "unknown"


_install_lock = threading.Lock()
#: Every recording live in this process, innermost last (under the threaded launcher, every rank's).
_live: list[_Recording] = []
_installed = False
_waits_patched = False  #: whether the waits are patched (counting completions; :func:`count_completions`)
#: Process group name -> its global ranks, for every group seen alive at a recording (groups are named once).
_known_groups: dict[str, tuple[int, ...]] = {}
#: Threads running a future's callback now -> what the waits inside it would have completed (per recording's log):
#: a wait there is no wait of the program (the future is done); waiting on the future the callback chains is.
_in_callback: dict[int, list[tuple[CollectiveLog, tuple[int, ...]]]] = {}
#: Threads inside an entry point already noted as another thread's (the process group's method under it is not).
_noting: set[int] = set()
#: ProcessGroup methods that issue a collective (a name bound before the probes still calls one of these).
PG_METHODS = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
              "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
              "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "broadcast", "reduce", "barrier",
              "gather", "scatter", "send", "recv")


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
    """One entry of the timeline: ``launch`` / ``wait`` (of ``call``), ``matmul``, ``mark``, ``other_thread`` (work
    on a thread no recording mode reached, ``label`` naming it and the thread, ``op`` ``collective`` or
    ``matmul``: not recorded).

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
    #: (event index, what) of work on a thread no recording mode reached while this one recorded (a helper
    #: thread's collective or matmul, naming the thread): not recorded, so the phase it falls in is not judged
    other_threads: list[tuple[int, str]] = field(default_factory=list)
    _lazy: dict[int, int] = field(default_factory=dict)  # storage ptr of a functional result -> call
    #: id(Work or Future) -> (it, kept alive; the calls waiting on it completes)
    _works: dict[int, tuple[Any, tuple[int, ...]]] = field(default_factory=dict)
    _names: dict[int, tuple[Any, frozenset[str]]] = field(default_factory=dict)  # storage ptr -> (storage; names)
    #: Threads (device, callback) append while the recording thread waits, or beside it: one at a time.
    _lock: Any = field(default_factory=threading.RLock, repr=False)

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
        name_storages(self, [tensor], frozenset({name}))

    def launch(self, call: CollectiveCall) -> int:
        with self._lock:
            call.launched = len(self.events)
            self.calls.append(call)
            index = len(self.calls) - 1
            self.events.append(Event("launch", call=index))
            if not call.overlappable:
                self.waited(index)  # a blocking call is done when it returns
            return index

    def waited(self, index: int) -> None:
        with self._lock:
            call = self.calls[index]
            if call.waited is None:
                call.waited = len(self.events)
                self.events.append(Event("wait", call=index))
                COMPLETED.note()

    def note_other_thread(self, what: str, *, collective: bool = True) -> None:
        """Note work no recording mode reached (``what`` names it and its thread; a collective, or a matmul), once
        per thread and kind."""
        with self._lock:
            if all(label != what for _, label in self.other_threads):
                self.other_threads.append((len(self.events), what))
                self.events.append(Event("other_thread", label=what, op="collective" if collective else "matmul"))

    def matmuls_while_in_flight(self, index: int, end: int | None = None) -> list[Event]:
        """Matmuls that ran after collective ``index`` was launched and before it was waited for -- or, never
        seen waited, before ``end`` (the end of the phase it belongs to; default: of the recording)."""
        call = self.calls[index]
        bound = len(self.events) if end is None else end
        stop = min(call.waited, bound) if call.waited is not None else bound
        return [e for e in self.events[call.launched + 1:stop] if e.what == "matmul"]

    def _work_waited(self, work: Any) -> None:
        with self._lock:
            entry = self._works.get(id(work))
            if entry is not None and entry[0] is work:
                del self._works[id(work)]
                for index in entry[1]:
                    self.waited(index)

    def _waits_for(self, handle: Any, calls: tuple[int, ...]) -> None:
        """Waiting on ``handle`` (a Work, or a Future) completes ``calls`` (beside those it completed already)."""
        if calls:
            with self._lock:
                entry = self._works.get(id(handle))
                before = entry[1] if entry is not None and entry[0] is handle else ()
                self._works[id(handle)] = (handle, tuple(dict.fromkeys(before + calls)))

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


@dataclass(eq=False)
class _Recording:
    """One live :func:`record_collectives` block: its log, its delay, the rank it records for, per-thread scratch."""

    log: CollectiveLog
    delay: Callable[[], None] | None
    rank: int | None  #: the rank thread it records for (:func:`conformance.harness.rank_threads.rank_of`)
    #: Thread ident -> the torch.distributed entry points it is inside now (outermost first).
    api_stacks: dict[int, list[tuple[str, bool, Any]]] = field(default_factory=dict)

    def api_stack(self) -> list[tuple[str, bool, Any]]:
        return self.api_stacks.setdefault(threading.get_ident(), [])

    def mine(self, rank: int | None) -> bool:
        """Whether work of rank thread ``rank`` (None: of no known rank) may belong to this recording."""
        return rank is None or self.rank is None or self.rank == rank


def _current() -> _Recording | None:
    """The innermost recording whose mode this thread carries (None: none does).

    The dispatch-mode stack is C++ thread-local state, which the autograd
    engine carries to its device threads (Python's ``threading.local`` is not).
    """
    import torch

    c = torch._C
    for index in range(c._len_torch_dispatch_stack() - 1, -1, -1):
        recording = getattr(c._get_dispatch_stack_at(index), "_coc_recording", None)
        if recording is not None:
            return recording
    return None


def _handle_waited(handle: Any) -> None:
    """``handle`` (a Work or a Future) was waited on: its calls complete in every recording that launched them,
    whichever thread waited."""
    deferred = _in_callback.get(threading.get_ident())
    if deferred is not None:  # a callback runs because its future is done: the program has not waited (yet)
        deferred.extend(_calls_of(handle))
        return
    for recording in list(_live):
        recording.log._work_waited(handle)


def _calls_of(handle: Any) -> list[tuple[CollectiveLog, tuple[int, ...]]]:
    """The calls waiting on ``handle`` completes, per live recording."""
    found = []
    for recording in list(_live):
        calls = recording.log._calls_of(handle)
        if calls:
            found.append((recording.log, calls))
    return found


def _note_other_thread(what: str) -> None:
    """Note ``what`` (work no recording mode reached) in every live recording of this thread's rank, naming the
    thread: those phases' structure is then not judged."""
    rank = rank_threads.rank_of()
    label = f"{what} on thread {threading.current_thread().name!r}"
    for recording in list(_live):
        if recording.mine(rank):
            recording.log.note_other_thread(label)


def _watched_by_none() -> bool:
    """Whether this thread carries no recording while one of its rank is live (what it issues goes unrecorded)."""
    if not _live or threading.get_ident() in _noting:
        return False
    rank = rank_threads.rank_of()
    return _current() is None and any(r.mine(rank) for r in list(_live))


def count_completions() -> None:
    """Patch the waits of ``Work`` and ``Future`` on the class, once per process: every wait that returns counts in
    :data:`COMPLETED`, and marks the calls of a recorded handle waited.

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
        _patch_waits(dist.distributed_c10d.Work, ("wait", "synchronize", "result"), ("is_completed",),
                     python_polls=True)
        _patch_waits(torch._C.Future, ("wait", "value"), ("done",))
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


def _patch_waits(cls: Any, waits: tuple[str, ...], polls: tuple[str, ...], *, python_polls: bool = False) -> None:
    """Patch ``waits`` and ``polls`` on ``cls`` (a Work, a Future): a handle waited on marks the calls it completes
    waited (a poll only when it answers True), and every wait that returns counts in :data:`COMPLETED` (a poll
    does not: polling a finished handle again is no new progress).  ``python_polls``: a poll of a subclass
    written in Python that hands it on here is answered by that subclass (:func:`_own_poll`)."""
    for method in (*waits, *polls):
        original = getattr(cls, method, None)
        if original is None:
            continue
        poll = method in polls

        def patched(self: Any, *args: Any, _original: Any = original, _poll: bool = poll, _name: str = method,
                    **kwargs: Any) -> Any:
            own = _own_poll(self, _name, cls) if _poll and python_polls else None
            result = _original(self, *args, **kwargs) if own is None else own()
            if _live and (not _poll or result):
                _handle_waited(self)
            if not _poll:
                COMPLETED.note()
            return result

        setattr(cls, method, patched)


#: The polls a Work's own override is answering, on this thread: ``(id(work), method)`` (:func:`_own_poll`).
_answering = threading.local()


def _own_poll(handle: Any, method: str, cls: Any) -> Callable[[], Any] | None:
    """The answer of a Work written in Python (a Python backend's, the emulated NPU's hccl Work) to a poll it hands on
    to what is patched on ``cls`` so that wrappers see it: torch's own method answers for the C++ base class there
    (``is_completed``: never).  None for torch's own Works, and while the override answers (one calling its base)."""
    own = getattr(type(handle), method, None)
    polls = _answering.__dict__.setdefault("polls", set())
    key = (id(handle), method)
    if not isinstance(own, types.FunctionType) or own is getattr(cls, method, None) or key in polls:
        return None

    def answer() -> Any:
        polls.add(key)
        try:
            return own(handle)
        finally:
            polls.discard(key)

    return answer


def install() -> None:
    """Patch the waits, the futures' chaining and torch.distributed's Python collectives, once per process: before
    a rank's first task (:func:`~conformance.harness.case.run_on_rank`), so that a callback the task registers
    before its first recording is one the probes can watch."""
    global _installed
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    count_completions()
    with _install_lock:
        if _installed:
            return
        _patch_futures(dist.distributed_c10d.Work, torch._C)
        c10d._coalescing_manager = _coalescing(c10d._coalescing_manager)
        for name in PY_COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = _api_wrapper(name, original)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapped)
        for method in PG_METHODS:
            original = getattr(dist.ProcessGroup, method, None)
            if original is not None:
                setattr(dist.ProcessGroup, method, _unseen_if_unrecorded(f"ProcessGroup.{method}", original))
        original_start = threading.Thread.start
        threading.Thread.start = functools.wraps(original_start)(  # type: ignore[method-assign]
            lambda self: _start_watched(self, original_start))
        _installed = True


def _patch_futures(work: Any, c: Any) -> None:
    """A future got from a recorded Work, chained with ``then`` or gathered by ``collect_all`` completes the
    calls its sources do when waited on; a callback registered inside a recording runs with its mode."""
    original_get_future = work.get_future

    # Not named get_future: a Work written in Python (a Python backend's, the emulated NPU's) reaches its own
    # get_future through pybind11, which skips the Python override when the calling frame has the method's name
    # and this object as its first argument (taking it for the override's own call of the base), and the base
    # raises "Work::getFuture not implemented".
    def probed_get_future(self: Any) -> Any:
        future = original_get_future(self)
        for log, calls in _calls_of(self):
            log._waits_for(future, calls)
        return future

    work.get_future = probed_get_future
    original_then, original_add = c.Future.then, c.Future.add_done_callback

    def then(self: Any, callback: Any) -> Any:
        chain = _Chain()
        chained = original_then(self, _callback(callback, chain))
        for log, calls in _calls_of(self):
            log._waits_for(chained, calls)
        chain.bind(chained)
        return chained

    c.Future.then = then
    c.Future.add_done_callback = lambda self, callback: original_add(self, _callback(callback, None))
    original_collect = c._collect_all

    def collect_all(futures: Any) -> Any:
        gathered = original_collect(futures)
        for recording in list(_live):
            calls = tuple(i for future in futures for i in recording.log._calls_of(future))
            recording.log._waits_for(gathered, calls)
        return gathered

    c._collect_all = collect_all


class _Chain:
    """The future ``then`` returns, and what the waits inside its callback would have completed: waiting on that
    future completes them (the callback, which waited for them, has returned).  The callback may run before
    ``then`` returns (a future already done: inline, as device backends run it), so what it left is held until the
    future is known."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._future: Any = None
        self._left: list[tuple[CollectiveLog, tuple[int, ...]]] = []

    def add(self, completed: list[tuple[CollectiveLog, tuple[int, ...]]]) -> None:
        with self._lock:
            if self._future is None:
                self._left.extend(completed)
                return
        for log, calls in completed:
            log._waits_for(self._future, calls)

    def bind(self, future: Any) -> None:
        with self._lock:
            self._future, left, self._left = future, self._left, []
        for log, calls in left:
            log._waits_for(future, calls)


def _callback(callback: Any, chain: _Chain | None) -> Any:
    """``callback`` as it runs on whichever thread completes its future, decided when it runs: with the mode of the
    recording it was registered in while that one is live; else, while a recording of its rank is live and the
    thread carries none, watched (its collectives and matmuls noted as unrecorded); a wait inside it is never the
    program's, but waiting on the future ``then`` chained (``chain``) completes what it waited for."""
    registered_in, registered_by = _current(), rank_threads.rank_of()

    @functools.wraps(callback)
    def run(future: Any) -> Any:
        ident = threading.get_ident()
        outer = _in_callback.get(ident)
        inside: list[tuple[CollectiveLog, tuple[int, ...]]] = []
        _in_callback[ident] = inside
        try:
            if _current() is None and registered_in is not None and registered_in in _live:
                with _mode_of(registered_in):
                    return callback(future)
            rank = registered_by if registered_by is not None else rank_threads.rank_of()
            if _current() is None and any(r.mine(rank) for r in list(_live)):
                with _unseen_mode()(f"a future's callback (run while no recording of its own is), on thread "
                                    f"{threading.current_thread().name!r}", rank):
                    return callback(future)
            return callback(future)
        finally:
            if outer is None:
                del _in_callback[ident]
            else:
                _in_callback[ident] = outer
            if chain is not None and inside:
                chain.add(inside)

    return run


def _start_watched(thread: threading.Thread, original_start: Any) -> None:
    """``Thread.start``: a thread started while a recording of its rank is live, carrying no mode, has what it
    issues or multiplies noted as unrecorded (the harness's own device thread carries the mode: not watched)."""
    rank = rank_threads.rank_of()
    if _live and not getattr(thread, "_coc_carries_mode", False) and any(r.mine(rank) for r in list(_live)):
        run = thread.run

        def watched_run() -> None:
            with rank_threads.working_for(rank):
                if _current() is not None:
                    run()
                    return
                with _unseen_mode()(f"helper thread {thread.name!r}", rank):
                    run()

        thread.run = watched_run  # type: ignore[method-assign]
    original_start(thread)


def _unseen_if_unrecorded(what: str, original: Any) -> Any:
    """``original`` (an entry point), noted as another thread's when its thread carries no live recording."""

    @functools.wraps(original)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if not _watched_by_none():
            return original(*args, **kwargs)
        _note_other_thread(what)
        ident = threading.get_ident()
        _noting.add(ident)
        try:
            return original(*args, **kwargs)
        finally:
            _noting.discard(ident)

    return entry


def _coalescing(original: Any) -> Any:
    """``_coalescing_manager`` that counts each collective inside it once, and waited when the manager's handle is
    (``cm.wait()``, which replaces the handles of the calls inside; ``batch_isend_irecv`` takes this path)."""
    @contextmanager
    @functools.wraps(original)
    def manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
        recording = _current()
        log = recording.log if recording is not None else None
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
    unseen = _unseen_if_unrecorded(name, original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recording = _current()
        if recording is None:
            return unseen(*args, **kwargs)
        log, delay = recording.log, recording.delay
        stack = recording.api_stack()
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
        seen = len(log.calls)
        stack.append((name, async_op, group))
        try:
            result = original(*args, **kwargs)
        finally:
            stack.pop()
        if not outermost or len(log.calls) > seen or _coalescing_now(group):
            return result  # the dispatcher saw it (its Work's wait is seen on the class), or it is only queued
        index = log.launch(CollectiveCall(f"api.{name}", shapes(args), name, async_op, *_group_ranks(group)))
        return _TrackedWork(result, log, index) if async_op and result is not None else result

    wrapper._coc_probe = True  # type: ignore[attr-defined]  # the original is ``__wrapped__``
    return wrapper


@functools.cache
def _mode_classes() -> tuple[type, type]:
    """The recording's dispatch mode and the watch of threads no recording reaches (made once torch is imported)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordingMode(TorchDispatchMode):
        """Records every collective and matmul into its recording, on whichever thread carries it."""

        def __init__(self, recording: _Recording) -> None:
            super().__init__()
            self._coc_recording = recording

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return _dispatch(self._coc_recording, func, args, kwargs or {})

    class UnseenMode(TorchDispatchMode):
        """Notes, once, that a thread no recording reaches issued a collective or multiplied."""

        def __init__(self, what: str, rank: int | None) -> None:
            super().__init__()
            self.what, self.rank = what, rank

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            collective = func.namespace in COLLECTIVE_NAMESPACES and func._opname not in NOT_COLLECTIVES
            noted = threading.get_ident() in _noting  # by the entry point that reached it
            if not noted and (collective or func._opname in MATMUL_OPS or _fused_name(func._opname)):
                label = f"{func.namespace}.{func._opname} in {self.what}"
                for recording in list(_live):
                    if recording.mine(self.rank):
                        recording.log.note_other_thread(label, collective=collective)
            return func(*args, **(kwargs or {}))

    return RecordingMode, UnseenMode


def _mode_of(recording: _Recording) -> Any:
    return _mode_classes()[0](recording)


def _unseen_mode() -> Any:
    return _mode_classes()[1]


def _dispatch(recording: _Recording, func: Any, args: Any, kwargs: Any) -> Any:
    """One op under a recording's mode: a collective is launched (and delayed), a matmul noted, names followed."""
    log = recording.log
    if log._lazy:
        note_lazy_waits(log, args, kwargs)
    names = names_of(log, args, kwargs) if log._names else frozenset()
    if func.namespace in COLLECTIVE_NAMESPACES and func._opname not in NOT_COLLECTIVES:
        if "wait" in func._opname:
            note_lazy_waits(log, args, kwargs)
            return func(*args, **kwargs)
        stack = recording.api_stack()
        if not stack and recording.delay is not None:
            recording.delay()
        call = _dispatched_call(func, args, kwargs, stack)
        out = func(*args, **kwargs)
        index = log.launch(call)
        for work in _works(out):
            log._waits_for(work, (index,))
        if call.functional:
            for ptr in storage_keys(out):
                log._lazy[ptr] = index
    elif func._opname in MATMUL_OPS:
        out = func(*args, **kwargs)
        shape = tuple(out.shape) if hasattr(out, "shape") else None
        log.events.append(Event("matmul", shape=shape, op=f"{func.namespace}.{func._opname}", operands=names))
        return out
    else:
        out = func(*args, **kwargs)
        if func.namespace == FUSED_KERNEL_NAMESPACE and func._opname in FUSED_KERNELS:
            FUSED_CALLS.note(func._opname, recording.rank)
        if func.namespace not in ("aten", "prim", "prims") and _fused_name(func._opname):
            log.events.append(Event("matmul", shape=tuple(getattr(out, "shape", ()) or ()), label="fused",
                                    op=f"{func.namespace}.{func._opname}", operands=names))
    if names:
        name_storages(log, [out, *written_arguments(func, args, kwargs)], names)
    return out


@contextmanager
def record_collectives(delay: Callable[[], None] | None = None) -> Iterator[CollectiveLog]:
    """Record every collective and matmul issued inside the block, on this thread and on every thread that carries
    its dispatch mode (an accelerator's autograd device thread, the CPU's emulated one).

    ``delay`` (e.g. a :class:`Straggler`) is called before every collective.
    """
    install()
    _remember_live_groups()
    log = CollectiveLog()
    recording = _Recording(log, delay, rank_threads.rank_of())
    with _install_lock:
        _live.append(recording)
    try:
        with _mode_of(recording):
            yield log
    finally:
        with _install_lock:
            _live.remove(recording)


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
    return CollectiveCall(f"{func.namespace}.{func._opname}", shapes(args), api, async_op, *ranks)


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


