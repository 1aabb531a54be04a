"""torch.distributed's Python entry points, wrapped: each call's arguments bound to the function's real signature
(``async_op`` and ``group`` by keyword or position), calls that never reach the dispatcher (process groups written
in Python, such as torch's threaded one) recorded, and their handles wrapped; the coalescing manager's calls
counted once, waited when its handle is.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conformance.harness.operands import shapes
from conformance.harness.probes.collective_log import CollectiveCall, CollectiveLog
from conformance.harness.probes.group_ranks import group_ranks
from conformance.harness.probes.recordings import current
from conformance.harness.probes.unseen_work import unseen_if_unrecorded

#: torch.distributed entry points that are wrapped (those this torch has).
PY_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
    "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "_reduce_scatter_base",
    "all_to_all", "all_to_all_single", "broadcast", "reduce", "barrier", "all_gather_object",
    "broadcast_object_list", "gather", "scatter", "send", "recv",
)  # not isend / irecv: torch compares them by identity (``P2POp``), so a wrapper would break an implementation
#    holding the original; their collectives are seen in the dispatcher
#: ProcessGroup methods that issue a collective (a name bound before the probes still calls one of these).
PG_METHODS = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
              "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
              "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "broadcast", "reduce", "barrier",
              "gather", "scatter", "send", "recv")


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


def coalescing(original: Any) -> Any:
    """``_coalescing_manager`` that counts each collective inside it once, and waited when the manager's handle is
    (``cm.wait()``, which replaces the handles of the calls inside; ``batch_isend_irecv`` takes this path)."""
    @contextmanager
    @functools.wraps(original)
    def manager(*args: Any, **kwargs: Any) -> Iterator[Any]:
        recording = current()
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


def api_wrapper(name: str, original: Any) -> Any:
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None
    unseen = unseen_if_unrecorded(name, original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        recording = current()
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
        index = log.launch(CollectiveCall(f"api.{name}", shapes(args), name, async_op, *group_ranks(group)))
        return _TrackedWork(result, log, index) if async_op and result is not None else result

    wrapper._coc_probe = True  # type: ignore[attr-defined]  # the original is ``__wrapped__``
    return wrapper
