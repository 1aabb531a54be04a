"""torch's functional collectives (``torch.distributed._functional_collectives``) on the hccl backend.

A functional collective (``_c10d_functional::all_reduce`` ...) returns a new tensor at once and runs like
any HCCL collective (:mod:`npu_sim.collectives`): its result is there once ``wait_tensor`` is called on it
(which ``AsyncCollectiveTensor`` does at first use), or at ``torch.npu.synchronize()``; until then the
returned tensor holds what it was allocated with.  Covered: all_reduce (and in place), all_gather_into_tensor
(and ``out=``), reduce_scatter_tensor (and ``out=``), all_to_all_single, broadcast (and in place), their
coalesced forms, wait_tensor; point-to-point functional ops are not modelled.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from npu_sim import collectives
from npu_sim.tensor import NpuTensor, wrap

RedOp = dist.ReduceOp.RedOpType
_OPERATORS = {"sum": RedOp.SUM, "avg": RedOp.AVG, "product": RedOp.PRODUCT, "min": RedOp.MIN, "max": RedOp.MAX}

_WORKS: dict[int, collectives.HcclWork] = {}  # address of a result's storage -> the collective writing it
_LOCK = threading.Lock()


def _group(name: Any) -> dist.ProcessGroup:
    return c10d._resolve_process_group(name) if isinstance(name, str) else dist.ProcessGroup.unbox(name)


def _operator(name: str) -> RedOp:
    if name.lower() not in _OPERATORS:
        raise RuntimeError(f"Cannot use reduce_op {name!r} with HCCL")
    return _OPERATORS[name.lower()]


def _fresh(like: torch.Tensor, shape=None) -> NpuTensor:
    raw = like.raw if isinstance(like, NpuTensor) else like
    return wrap(torch.empty(shape if shape is not None else raw.shape, dtype=raw.dtype))


def _pending(work: collectives.HcclWork, results: list[NpuTensor]) -> None:
    with _LOCK:
        for result in results:
            _WORKS[result.raw.untyped_storage().data_ptr()] = work


def _all_reduce(a: dict, in_place: bool) -> Any:
    inputs = a["inputs"] if "inputs" in a else [a["input"]]
    outputs = inputs if in_place else [_fresh(t) for t in inputs]
    if not in_place:
        for output, source in zip(outputs, inputs):
            output.raw.copy_(collectives._raw(source))
    work = collectives._allreduce({"tensors": outputs, "process_group": _group(a["group_name"]),
                                   "reduce_op": _operator(a["reduce_op"])})
    _pending(work, outputs)
    return outputs if "inputs" in a else outputs[0]


def _all_gather(a: dict) -> Any:
    group = _group(a["group_name"])
    inputs = a["inputs"] if "inputs" in a else [a["input"]]
    outputs = [a["out"]] if "out" in a else [
        _fresh(t, (t.shape[0] * a["group_size"], *t.shape[1:])) for t in inputs]
    for output, source in zip(outputs, inputs):
        work = collectives._allgather_base({"process_group": group, "output_tensor": output, "input_tensor": source})
        _pending(work, [output])
    return outputs if "inputs" in a else outputs[0]


def _reduce_scatter(a: dict) -> Any:
    group, op = _group(a["group_name"]), _operator(a["reduce_op"])
    inputs = a["inputs"] if "inputs" in a else [a["input"]]
    outputs = [a["out"]] if "out" in a else [
        _fresh(t, (t.shape[0] // a["group_size"], *t.shape[1:])) for t in inputs]
    for output, source in zip(outputs, inputs):
        work = collectives._reduce_scatter_base({"process_group": group, "reduce_op": op, "output_tensor": output,
                                                 "input_tensor": source})
        _pending(work, [output])
    return outputs if "inputs" in a else outputs[0]


def _all_to_all(a: dict) -> Any:
    source = a["input"]
    rows = sum(a["output_split_sizes"]) if a["output_split_sizes"] else source.shape[0]
    output = _fresh(source, (rows, *source.shape[1:]))
    work = collectives._alltoall_base({"process_group": _group(a["group_name"]), "output": output, "input": source,
                                       "output_split_sizes": list(a["output_split_sizes"]),
                                       "input_split_sizes": list(a["input_split_sizes"])})
    _pending(work, [output])
    return output


def _broadcast(a: dict, in_place: bool) -> Any:
    group = _group(a["group_name"])
    output = a["input"] if in_place else _fresh(a["input"])
    if not in_place:
        output.raw.copy_(collectives._raw(a["input"]))
    work = collectives._broadcast({"process_group": group, "tensors": [output], "root_rank": a["src"]})
    _pending(work, [output])
    return output


def _wait_tensor(a: dict) -> Any:
    tensor = a["tensor"]
    with _LOCK:
        work = _WORKS.pop(collectives._raw(tensor).untyped_storage().data_ptr(), None)
    if work is not None:
        work.complete()
    return tensor


_IMPLS = {
    "all_reduce": lambda a: _all_reduce(a, False),
    "all_reduce_": lambda a: _all_reduce(a, True),
    "all_reduce_coalesced": lambda a: _all_reduce(a, False),
    "all_reduce_coalesced_": lambda a: _all_reduce(a, True),
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_out": _all_gather,
    "all_gather_into_tensor_coalesced": _all_gather,
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_out": _reduce_scatter,
    "reduce_scatter_tensor_coalesced": _reduce_scatter,
    "all_to_all_single": _all_to_all,
    "broadcast": lambda a: _broadcast(a, False),
    "broadcast_": lambda a: _broadcast(a, True),
    "wait_tensor": _wait_tensor,
}


def handle(func, args: tuple, kwargs: dict) -> Any:
    """The ``_c10d_functional`` namespace handler of npu tensors."""
    impl = _IMPLS.get(func._opname)
    if impl is None:
        if func._opname in ("isend", "irecv", "batch_p2p_ops"):
            raise NotImplementedError(f"npu-sim does not model _c10d_functional.{func._opname}")
        # The namespace's Python helpers (_wrap_tensor_autograd, which wraps the result in an
        # AsyncCollectiveTensor): their own kernel, on the npu tensor itself.
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
            return func(*args, **kwargs)
    bound = dict(zip((arg.name for arg in func._schema.arguments), args))
    bound.update(kwargs)
    return impl(bound)
