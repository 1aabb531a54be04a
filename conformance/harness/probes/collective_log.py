"""The recording model: a rank's timeline of collective launches, their waits, matmuls and marks.

What the interception (:mod:`conformance.harness.probes`) writes and the
contract's summary (:mod:`conformance.harness.observed`) reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from conformance.harness.completions import COMPLETED
from conformance.harness.operands import name_storages
from conformance.harness.probes.group_ranks import LIVE

_KINDS = (("all_reduce", ("allreduce", "all_reduce")),
          ("all_gather", ("allgather", "all_gather")),
          ("reduce_scatter", ("reduce_scatter",)),
          ("all_to_all", ("alltoall", "all_to_all")))


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
