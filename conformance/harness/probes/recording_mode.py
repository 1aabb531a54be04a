"""The recording's dispatch mode: every op a thread carrying it dispatches, a collective launched (and delayed), a
matmul noted, operand names carried along.

Every call style meets in the dispatcher: a torch dispatch mode sees every
c10d op (``c10d.allreduce_``, ``c10d._allgather_base_`` ...) and functional
collective, however the implementation reached it, and keeps the ``Work``
each returns.  A matmul records the names its operands carry
(:mod:`conformance.harness.operands`).
"""

from __future__ import annotations

import functools
from typing import Any

from conformance.harness.completions import FUSED_CALLS
from conformance.harness.operands import (
    name_storages,
    names_of,
    note_lazy_waits,
    shapes,
    storage_keys,
    written_arguments,
)
from conformance.harness.probes.collective_log import CollectiveCall, Event
from conformance.harness.probes.group_ranks import functional_ranks, group_ranks
from conformance.harness.probes.recordings import Recording

#: Ops of the collective namespaces that are no collective.
NOT_COLLECTIVES = frozenset({"_wrap_tensor_autograd"})
#: Dispatcher namespaces of collective ops.
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
#: aten ops counted as matmuls.
MATMUL_OPS = frozenset({"mm", "addmm", "addmm_", "bmm", "baddbmm", "addbmm", "_addmm_activation", "matmul",
                        "linear", "mv", "addmv", "dot", "_int_mm", "_scaled_mm", "_weight_int8pack_mm"})
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


@functools.cache
def _recording_mode() -> type:
    """The recording's dispatch mode (made once torch is imported)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordingMode(TorchDispatchMode):
        """Records every collective and matmul into its recording, on whichever thread carries it."""

        def __init__(self, recording: Recording) -> None:
            super().__init__()
            self._coc_recording = recording

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return dispatch(self._coc_recording, func, args, kwargs or {})

    return RecordingMode


def mode_of(recording: Recording) -> Any:
    """The dispatch mode that records into ``recording`` on whichever thread carries it."""
    return _recording_mode()(recording)


def dispatch(recording: Recording, func: Any, args: Any, kwargs: Any) -> Any:
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
        if func.namespace not in ("aten", "prim", "prims") and fused_name(func._opname):
            log.events.append(Event("matmul", shape=tuple(getattr(out, "shape", ()) or ()), label="fused",
                                    op=f"{func.namespace}.{func._opname}", operands=names))
    if names:
        name_storages(log, [out, *written_arguments(func, args, kwargs)], names)
    return out



def _dispatched_call(func: Any, args: Any, kwargs: Any, stack: list[tuple[str, bool, Any]]) -> CollectiveCall:
    schema = func._schema.arguments
    values = dict(zip((a.name for a in schema), args))
    values.update(kwargs)
    async_op: bool | None
    if stack:  # called through torch.distributed: the user's own arguments say it all
        api, async_op, group = stack[0]
        ranks = group_ranks(group)
    else:
        api = None
        defaults = {a.name: a.default_value for a in schema if a.has_default_value()}
        flag = values.get("async_op", defaults.get("async_op"))
        async_op = None if flag is None else bool(flag)
        group = values["process_group"] if "process_group" in values else values.get("group_name")
        ranks = functional_ranks(group) if isinstance(group, str) else group_ranks(group)
    return CollectiveCall(f"{func.namespace}.{func._opname}", shapes(args), api, async_op, *ranks)



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


def fused_name(name: str) -> bool:
    """A vendor op that multiplies and communicates in one (e.g. torch_npu's MC2 kernels)."""
    lowered = name.lower()
    return ("mm" in lowered or "matmul" in lowered) and any(
        k in lowered for k in ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter"))
