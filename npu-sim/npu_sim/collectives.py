"""The hccl backend's collectives: torch's ``c10d`` ops on npu tensors, asynchronous as HCCL's are.

torch's collective API dispatches ``c10d::allreduce_``, ``c10d::_allgather_base_`` ... with the tensors;
an npu tensor's ``__torch_dispatch__`` (after any ``TorchDispatchMode``, so probes still see the c10d op)
hands them to :func:`handle`, which finds the group's :class:`~npu_sim.hccl.HcclBackend` and enqueues
the collective, as HCCL enqueues it on its own stream:

* the inputs are read at enqueue; the bytes travel over gloo (data movement only: bit exact);
* the outputs keep what they held until the collective completes (:class:`~npu_sim.work.HcclWork`:
  ``Work.wait()``, ``Work.synchronize()``, taking its future, ``torch.npu.synchronize()``); the result is
  staged and written at completion;
* reductions fold the ranks' contributions in arrival order (:mod:`npu_sim.reductions`);
* ``Work.get_future()`` returns a future that is already complete, as device backends' futures complete
  at enqueue (their value is valid for work queued after it on the device).  A host that reads that value
  must find the result in it, so taking the future completes the collective first.

Covered: all_reduce, all_gather (list and into one tensor), reduce_scatter (list and from one tensor),
all_to_all (list and single), broadcast, reduce, gather, scatter, send / recv, barrier, and the coalesced
all_reduce / all_gather / reduce_scatter ops torch routes batched calls to.  Refused as HCCL refuses them:
``recv`` from any source, ``monitored_barrier`` (gloo's), sparse all_reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from npu_sim import hccl, reductions
from npu_sim.tensor import NpuTensor
from npu_sim.work import TRANSFER_WAIT, HcclWork

RedOp = dist.ReduceOp.RedOpType


# --------------------------------------------------------------------------- helpers


_NPU: list[torch.device] = []


def _backend(group) -> hccl.HcclBackend:
    """The hccl backend of ``group`` (a ProcessGroup, or one boxed by the dispatcher), its communicator created."""
    if not isinstance(group, dist.ProcessGroup):
        group = dist.ProcessGroup.unbox(group)
    if not _NPU:
        _NPU.append(torch.device("npu"))
    backend = group._get_backend(_NPU[0])
    if not isinstance(backend, hccl.HcclBackend):
        raise RuntimeError(f"npu tensors need an hccl group; group {group.group_name!r} has {type(backend).__name__}")
    backend.ensure_communicator()
    return backend


def _raw(tensor) -> torch.Tensor:
    if type(tensor) is not NpuTensor:
        raise RuntimeError(f"HCCL collectives take npu tensors, got a tensor on {tensor.device}")
    return tensor.raw


def _bytes(raw: torch.Tensor) -> torch.Tensor:
    """A snapshot of ``raw``'s values as flat bytes (what HCCL reads at enqueue)."""
    return raw.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def _write(raw: torch.Tensor, data: torch.Tensor) -> None:
    """Write flat bytes ``data`` into ``raw`` as ``raw``'s dtype and shape."""
    raw.copy_(data.view(raw.dtype).view(raw.shape))


def _write_all(tensors, staged: list[torch.Tensor]) -> None:
    """Write each staged buffer into its npu tensor (what completing a data-moving collective does)."""
    for tensor, buffer in zip(tensors, staged):
        _write(_raw(tensor), buffer)


def _redop(reduce_op) -> RedOp:
    """The operator of a ReduceOp (boxed by the dispatcher) or a RedOpType."""
    op = reduce_op if isinstance(reduce_op, RedOp) else RedOp(reduce_op.op())
    if op == RedOp.PREMUL_SUM:
        raise NotImplementedError("npu-sim does not model ReduceOp.PREMUL_SUM")
    return op


def _gather(backend: hccl.HcclBackend, data: torch.Tensor) -> tuple[dist.Work, list[torch.Tensor]]:
    buffers = [torch.empty_like(data) for _ in range(backend.group_size)]
    return ProcessGroupGloo.allgather(backend, [buffers], [data]), buffers


def _reduction(backend: hccl.HcclBackend, name: str, inputs: list[torch.Tensor], op: RedOp,
               finish: Callable[[list[list[torch.Tensor]], list[int], bool], None], result: Any) -> HcclWork:
    """Gather every rank's ``inputs`` with its arrival time; ``finish(contributions, arrivals, deterministic)``."""
    for raw in inputs:
        reductions.check(name, op, raw.dtype)
    deterministic = backend.communicator.deterministic
    transfer, buffers = _gather(backend, reductions.pack(inputs, reductions.arrival()))

    def done() -> None:
        arrivals, contributions = zip(*(reductions.unpack(buffer, inputs) for buffer in buffers))
        finish(list(contributions), list(arrivals), deterministic)

    return HcclWork([transfer], done, result)


def reduce_now(backend: hccl.HcclBackend, contribution: torch.Tensor, op: RedOp = RedOp.SUM) -> torch.Tensor:
    """A blocking all-reduce of one CPU tensor, in arrival order (what the MC2 kernels' reductions do)."""
    backend.ensure_communicator()
    out: list[torch.Tensor] = []
    _reduction(backend, "allreduce", [contribution], op,
               lambda c, a, d: out.append(reductions.fold([x[0] for x in c], a, op, d)), None).complete()
    return out[0]


def gather_now(backend: hccl.HcclBackend, raw: torch.Tensor) -> list[torch.Tensor]:
    """A blocking all-gather of one CPU tensor, bit exact, in group-rank order."""
    backend.ensure_communicator()
    transfer, buffers = _gather(backend, _bytes(raw))
    TRANSFER_WAIT(transfer)
    return [buffer.view(raw.dtype).view(raw.shape) for buffer in buffers]


# --------------------------------------------------------------------------- reductions


def _allreduce(a: dict) -> Any:
    if a.get("sparse_indices") is not None:
        raise RuntimeError("HCCL does not support sparse all_reduce")
    backend, op, tensors = _backend(a["process_group"]), _redop(a["reduce_op"]), a["tensors"]
    raws = [_raw(t) for t in tensors]

    def finish(contributions, arrivals, deterministic):
        for i, raw in enumerate(raws):
            raw.copy_(reductions.fold([c[i] for c in contributions], arrivals, op, deterministic))

    return _reduction(backend, "allreduce", raws, op, finish, tensors)


def _reduce(a: dict) -> Any:
    backend, op, tensors, root = _backend(a["process_group"]), _redop(a["reduce_op"]), a["tensors"], a["root_rank"]
    raws = [_raw(t) for t in tensors]

    def finish(contributions, arrivals, deterministic):
        if backend.group_rank == root:
            for i, raw in enumerate(raws):
                raw.copy_(reductions.fold([c[i] for c in contributions], arrivals, op, deterministic))

    return _reduction(backend, "reduce", raws, op, finish, tensors)


def _reduce_scatter_base(a: dict) -> Any:
    backend, op = _backend(a["process_group"]), _redop(a["reduce_op"])
    output, source = _raw(a["output_tensor"]), _raw(a["input_tensor"])
    if source.numel() != output.numel() * backend.group_size:
        raise ValueError(f"reduce_scatter: input has {source.numel()} elements, expected the output's "
                         f"{output.numel()} times the group size {backend.group_size}")
    chunk = output.numel()
    rows = slice(backend.group_rank * chunk, (backend.group_rank + 1) * chunk)

    def finish(contributions, arrivals, deterministic):
        mine = [c[0].reshape(-1)[rows] for c in contributions]
        output.copy_(reductions.fold(mine, arrivals, op, deterministic).view(output.shape))

    return _reduction(backend, "reduce_scatter", [source], op, finish, a["output_tensor"])


def _reduce_scatter(a: dict) -> Any:
    backend, op = _backend(a["process_group"]), _redop(a["reduce_op"])
    outputs, inputs = a["output_tensors"], a["input_tensors"]
    flat = [_raw(t) for chunks in inputs for t in chunks]
    size, rank = backend.group_size, backend.group_rank

    def finish(contributions, arrivals, deterministic):
        for i, output in enumerate(outputs):
            mine = [c[i * size + rank] for c in contributions]
            _raw(output).copy_(reductions.fold(mine, arrivals, op, deterministic))

    return _reduction(backend, "reduce_scatter", flat, op, finish, outputs)


def _reduce_scatter_coalesced(a: dict) -> Any:
    works = [_reduce_scatter_base({"process_group": a["process_group"], "reduce_op": a["reduce_op"],
                                   "output_tensor": out, "input_tensor": inp})
             for out, inp in zip(a["outputs"], a["inputs"])]
    return _joined(works, a["outputs"])


def _allreduce_coalesced(a: dict) -> Any:
    return _allreduce({**a, "sparse_indices": None}).boxed()


# --------------------------------------------------------------------------- data movement


def _joined(works: list[HcclWork], result: Any) -> Any:
    """One work for several collectives issued together (coalesced ops)."""
    joined = HcclWork([], lambda: [work.complete() for work in works], result)
    return joined.boxed()


def _allgather(a: dict) -> Any:
    backend = _backend(a["process_group"])
    outputs, inputs = a["output_tensors"], a["input_tensors"]
    transfers, staged = [], []
    for source in inputs:
        transfer, buffers = _gather(backend, _bytes(_raw(source)))
        transfers.append(transfer)
        staged.append(buffers)

    def finish():
        for lists, buffers in zip(outputs, staged):
            _write_all(lists, buffers)

    return HcclWork(transfers, finish, outputs)


def _allgather_base(a: dict) -> Any:
    backend = _backend(a["process_group"])
    output, source = _raw(a["output_tensor"]), _raw(a["input_tensor"])
    if output.numel() != source.numel() * backend.group_size:
        raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, expected the input's "
                         f"{source.numel()} times the group size {backend.group_size}")
    transfer, buffers = _gather(backend, _bytes(source))
    return HcclWork([transfer], lambda: _write(output, torch.cat(buffers)), a["output_tensor"])


def _allgather_coalesced(a: dict) -> Any:
    work = _allgather({"process_group": a["process_group"], "output_tensors": a["output_lists"],
                       "input_tensors": a["input_list"]})
    return work.boxed()


def _allgather_into_tensor_coalesced(a: dict) -> Any:
    works = [_allgather_base({"process_group": a["process_group"], "output_tensor": out, "input_tensor": inp})
             for out, inp in zip(a["outputs"], a["inputs"])]
    return _joined(works, a["outputs"])


def _broadcast(a: dict) -> Any:
    backend, tensors, root = _backend(a["process_group"]), a["tensors"], a["root_rank"]
    transfers, staged = [], []
    for tensor in tensors:
        buffer = _bytes(_raw(tensor))
        transfers.append(ProcessGroupGloo.broadcast(backend, buffer, root))
        staged.append(buffer)

    def finish():
        if backend.group_rank != root:
            _write_all(tensors, staged)

    return HcclWork(transfers, finish, tensors)


def _alltoall_base(a: dict) -> Any:
    backend = _backend(a["process_group"])
    output, source = _raw(a["output"]), _raw(a["input"])

    def in_bytes(raw, splits):
        row = raw[0].numel() * raw.element_size() if raw.dim() and raw.shape[0] else 0
        return [s * row for s in splits]

    staging = torch.empty(output.numel() * output.element_size(), dtype=torch.uint8)
    transfer = ProcessGroupGloo.alltoall_base(backend, staging, _bytes(source),
                                              in_bytes(output, a["output_split_sizes"]),
                                              in_bytes(source, a["input_split_sizes"]))
    return HcclWork([transfer], lambda: _write(output, staging), [a["output"]])


def _alltoall(a: dict) -> Any:
    backend = _backend(a["process_group"])
    outputs, inputs = a["output_tensors"], a["input_tensors"]
    staging = [torch.empty(_raw(t).numel() * t.element_size(), dtype=torch.uint8) for t in outputs]
    transfer = ProcessGroupGloo.alltoall(backend, staging, [_bytes(_raw(t)) for t in inputs])

    return HcclWork([transfer], lambda: _write_all(outputs, staging), outputs)


def _gather_to_root(a: dict) -> Any:
    backend, root = _backend(a["process_group"]), a["root_rank"]
    outputs, (source,) = a["output_tensors"], a["input_tensors"]
    data = _bytes(_raw(source))
    staging = [torch.empty_like(data) for _ in outputs[0]] if outputs else []
    transfer = ProcessGroupGloo.gather(backend, staging, data, root)

    return HcclWork([transfer], lambda: _write_all(outputs[0] if outputs else [], staging), outputs).boxed()


def _scatter(a: dict) -> Any:
    backend, root = _backend(a["process_group"]), a["root_rank"]
    (output,), inputs = a["output_tensors"], a["input_tensors"]
    staging = torch.empty(_raw(output).numel() * output.element_size(), dtype=torch.uint8)
    sources = [_bytes(_raw(t)) for t in inputs[0]] if inputs else []
    transfer = ProcessGroupGloo.scatter(backend, staging, sources, root)
    return HcclWork([transfer], lambda: _write(_raw(output), staging), a["output_tensors"])


def _send(a: dict) -> Any:
    backend = _backend(a["process_group"])
    data = [_bytes(_raw(t)) for t in a["tensors"]]
    return HcclWork([ProcessGroupGloo.send(backend, data, a["dst"], a["tag"])], None, a["tensors"]).boxed()


def _recv(a: dict) -> Any:
    backend, tensors = _backend(a["process_group"]), a["tensors"]
    staging = [torch.empty(_raw(t).numel() * t.element_size(), dtype=torch.uint8) for t in tensors]
    transfer = ProcessGroupGloo.recv(backend, staging, a["src"], a["tag"])

    return HcclWork([transfer], lambda: _write_all(tensors, staging), tensors).boxed()


def _barrier(a: dict) -> Any:
    backend = _backend(a["process_group"])
    return HcclWork([ProcessGroupGloo.barrier(backend)], None, []).boxed()


def _refused(what: str) -> Callable[[dict], Any]:
    def refuse(a: dict) -> Any:
        raise RuntimeError(f"HCCL does not support {what}")

    return refuse


def _with_tensors(impl: Callable[[dict], HcclWork], key: str) -> Callable[[dict], Any]:
    """Ops that return ``(tensors, work)``."""
    return lambda a: (a[key], impl(a).boxed())


def _work_only(impl: Callable[[dict], HcclWork]) -> Callable[[dict], Any]:
    return lambda a: impl(a).boxed()


#: c10d op name -> implementation taking the op's arguments by name, returning what the op's schema returns.
_IMPLS: dict[str, Callable[[dict], Any]] = {
    "allreduce_": _with_tensors(_allreduce, "tensors"),
    "allreduce_coalesced_": _allreduce_coalesced,
    "reduce_": _work_only(_reduce),
    "_reduce_scatter_base_": _with_tensors(_reduce_scatter_base, "output_tensor"),
    "reduce_scatter_": _with_tensors(_reduce_scatter, "output_tensors"),
    "reduce_scatter_tensor_coalesced_": _reduce_scatter_coalesced,
    "allgather_": _with_tensors(_allgather, "output_tensors"),
    "_allgather_base_": _with_tensors(_allgather_base, "output_tensor"),
    "allgather_coalesced_": _allgather_coalesced,
    "allgather_into_tensor_coalesced_": _allgather_into_tensor_coalesced,
    "broadcast_": _with_tensors(_broadcast, "tensors"),
    "alltoall_base_": _work_only(_alltoall_base),
    "alltoall_": _with_tensors(_alltoall, "output_tensors"),
    "gather_": _gather_to_root,
    "scatter_": _with_tensors(_scatter, "output_tensors"),
    "send": _send,
    "recv_": _recv,
    "barrier": _barrier,
    "recv_any_source_": _refused("recv from any source"),
    "monitored_barrier_": _refused("monitored_barrier (a gloo feature)"),
}

_NAMES: dict[Any, tuple[str, ...]] = {}


def handle(func, args: tuple, kwargs: dict) -> Any:
    """The ``c10d`` namespace handler of npu tensors."""
    name = func._opname
    if name == "check_for_nan":
        return func(_raw(args[0]))
    impl = _IMPLS.get(name)
    if impl is None:
        raise NotImplementedError(f"npu-sim does not model c10d.{name} on npu tensors")
    names = _NAMES.get(func)
    if names is None:
        names = _NAMES[func] = tuple(arg.name for arg in func._schema.arguments)
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return impl(bound)
