"""Ascend backend of the fused CoC ops: torch_npu's MC2 kernels over HCCL.

:func:`run` takes a call that :meth:`coc_impl.validated_call.ValidatedCall.validate`
has already checked; :func:`check` adds what the MC2 kernels take on this runtime
(:mod:`coc_impl.backends.npu_runtime`) within their documented limits
(:mod:`coc_impl.backends.mc2_limits`), so every rank of a group raises the same
error, before any collective.  ``backend="auto"`` asks :func:`check` and runs the
portable backend for any call it refuses.  Activations must be float16 or
bfloat16 on an NPU device (:class:`CoCArgumentError`, checked before the runtime
is asked for).

Binding (torch_npu 2.13.0, ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``,
the same lines as Ascend/op-plugin's ``op_plugin/config/op_plugin_functions.yaml``):

=======================  ==============================================
op                       kernel, called as ``torch.ops.npu.<kernel>``
=======================  ==============================================
matmul_all_reduce        ``npu_mm_all_reduce_base(x1, x2, hcom, *, ...)``
matmul_reduce_scatter    ``npu_mm_reduce_scatter_base(self, x2, hcom, world_size, *, ...)``
all_gather_matmul(_v2)   ``npu_all_gather_base_mm(self, x2, hcom, world_size, *, gather_output=...)``
=======================  ==============================================

The kernels are reached through ``torch.ops.npu``, resolved at call time, never
as ``torch_npu.<kernel>``: importing ``torch_npu.onnx`` replaces those
attributes with positional wrappers.

Operands:

* Weights: MC2 reads ``x2`` as a logical ``[k, n]`` matrix, stored either ND or
  as the transposed view of an ND ``[n, k]`` tensor.  ``transpose_weight=True``
  is honoured by passing ``w.t()`` (a view, no copy); transposition is never
  inferred from shapes, which is ambiguous for square weights.
* w8A16: ``antiquant_scale`` / ``antiquant_offset`` / ``antiquant_group_size``
  go to ``npu_mm_all_reduce_base``, whose dequantisation ``(x2 + offset) *
  scale`` is the spec's.  The kernel reads a per-group scale and offset with
  ``x2``'s transpose flag, so when ``x2`` is a transposed view they are passed
  as the transposed view of an ND ``[n, ceil(k/g)]`` tensor too.
* Bias: the kernels' documented formula is ``reduce(x1 @ x2 + bias)``, i.e. a
  bias handed to them is added on every rank before the reduction (``tp``
  times), and the all-gather / reduce-scatter kernels reject a non-zero bias.
  Bias is therefore never given to MC2; it is added once to the result.
* Communicator: MC2 names the HCCL communicator by string, taken from the
  group's HCCL backend with ``get_hccl_comm_name(global_rank)``.

Determinism: CANN documents ``HCCL_DETERMINISTIC`` for MatmulAllReduce as well
as for HCCL's collectives; it makes a kernel's reduction reproducible from run
to run, in an order of the kernel's choosing and in the output dtype -- what
the protocol's ``deterministic=True`` asks.  This implementation defines one
result (:mod:`coc_impl.deterministic`: float32 partials summed in ascending
rank order, bias in float32, one cast), the same bits as the portable backend
on any device whose GEMM agrees, and no MC2 switch yields that order.  So
``deterministic=True`` does not use MC2: it runs the portable pipeline
(:mod:`coc_impl.backends.portable`) on the NPU over HCCL, whose reducer moves
the float32 partials by pure data movement (all-gather / all-to-all, bit
exact) and sums them locally in rank order -- the definition itself, still
overlapped block by block, just not fused.  The per-rank matmul is
reproducible only under ``torch.use_deterministic_algorithms(True)`` (set once
at rank start-up, before the first NPU op); without it the op raises
:class:`CoCBackendUnavailable` rather than claim determinism.

ATB: MindSpeed's fused CoC reaches ATB's ``LinearParallelOperation`` (backend
``lcoc``) through its own C++ extension; torch_npu exposes no such op.  The
NNAL ``torch_atb`` bindings do, but their input order per parallel type and
their residual semantics are not documented precisely enough to bind without
hardware, and they have no determinism switch, so MC2 is the binding here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from coc_impl.backends import mc2_limits, npu_runtime, portable
from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    from coc_impl.validated_call import ValidatedCall

__all__ = ["check", "run"]

#: Activation dtypes of the MC2 kernels (int8 only for their fully quantised modes).
_MC2_DTYPES = (torch.float16, torch.bfloat16)


def check(call: ValidatedCall) -> None:
    """Raise the declared error if the MC2 binding cannot take ``call`` here.

    Float16/bfloat16 is checked first, on the host (:class:`CoCArgumentError`);
    then the runtime, the device, the determinism requirement and the documented
    limits (:class:`CoCBackendUnavailable`, naming the limit and its source).
    """
    op = call.op
    if call.x.dtype not in _MC2_DTYPES:
        raise CoCArgumentError(f"{op}: x must be float16 or bfloat16 on Ascend, got {call.x.dtype}")
    runtime = npu_runtime.runtime()
    if call.x.device.type != npu_runtime.npu_device().type:
        raise CoCArgumentError(f"{op}: the Ascend backend takes NPU tensors, x is on {call.x.device}")
    if call.deterministic:
        _require_deterministic_algorithms(op)
        return
    mc2_limits.check_limits(call, runtime)


def run(call: ValidatedCall) -> Tensor | tuple[Tensor, Tensor]:
    """One validated call on the MC2 kernels (``deterministic=True``: the portable pipeline)."""
    check(call)
    if call.deterministic:
        return portable.run(call)
    mc2_limits.claim_domain(call, npu_runtime.runtime())
    x1, x2, hcom = call.x.contiguous(), _weight_kn(call), _hccl_comm_name(call.group)
    npu = torch.ops.npu  # resolved now: torch_npu.<kernel> may be an onnx wrapper
    op = call.op
    if op == "matmul_all_reduce":
        out = npu.npu_mm_all_reduce_base(x1, x2, hcom, reduce_op="sum", comm_turn=0, **_antiquant_kwargs(call, x2))
        return call.add_bias(out)
    if op == "matmul_reduce_scatter":
        out = npu.npu_mm_reduce_scatter_base(x1, x2, hcom, call.tp, reduce_op="sum", comm_turn=0)
        return call.add_bias(out)
    gather_output = op == "all_gather_matmul_v2"
    out, gathered = npu.npu_all_gather_base_mm(
        x1, x2, hcom, call.tp, gather_index=0, gather_output=gather_output, comm_turn=0
    )
    return (call.add_bias(out), gathered) if gather_output else call.add_bias(out)


def _antiquant_kwargs(call: ValidatedCall, x2: Tensor) -> dict[str, Any]:
    """w8A16 arguments of ``npu_mm_all_reduce_base``; only what is set, so releases without per-group still bind.

    A per-group scale (and offset) is read with ``x2``'s transpose flag, so it
    takes ``x2``'s layout: a transposed view of an ND ``[n, ceil(k/g)]`` tensor
    when ``x2`` is one of ``[n, k]``.
    """
    aq = call.antiquant
    if aq is None:
        return {}
    transposed = aq.granularity == "group" and not x2.is_contiguous()

    def layout(t: Tensor) -> Tensor:
        return t.t().contiguous().t() if transposed else t.contiguous()

    kwargs: dict[str, Any] = {"antiquant_scale": layout(aq.scale)}
    if aq.offset is not None:
        kwargs["antiquant_offset"] = layout(aq.offset)
    if aq.group_size:
        kwargs["antiquant_group_size"] = aq.group_size
    return kwargs


def _require_deterministic_algorithms(op: str) -> None:
    if not torch.are_deterministic_algorithms_enabled():
        raise CoCBackendUnavailable(
            f"{op}(deterministic=True) on Ascend needs torch.use_deterministic_algorithms(True), "
            "set once at rank start-up before the first NPU op, so the per-rank matmul is reproducible"
        )


def _weight_kn(call: ValidatedCall) -> Tensor:
    """``w`` as a logical ``[k, n]`` matrix in a layout MC2 reads: ND or a transposed ND view."""
    kn = call.w.t() if call.transpose_weight else call.w
    if kn.is_contiguous() or kn.t().is_contiguous():
        return kn
    return kn.contiguous()


def _hccl_comm_name(group: ProcessGroup) -> str:
    """The HCCL communicator name MC2 needs; torch_npu keys it by global rank."""
    global_rank = dist.get_global_rank(group, group.rank())
    hccl = group._get_backend(npu_runtime.npu_device())  # torch_npu's ProcessGroupHCCL
    return hccl.get_hccl_comm_name(global_rank)  # type: ignore[attr-defined]
