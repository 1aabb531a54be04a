"""Misuses of torch_npu's MC2 kernels (judged on the emulated NPU node: ``--coc-emulate-npu``)."""

from __future__ import annotations

from typing import Any

from coc_impl.reference import ReferenceCoCAuto
from tests.support.faulty_impls._shared import _group_of_its_own


class _CallsMc2Itself(ReferenceCoCAuto):
    """The all-reduce on torch_npu's ``npu_mm_all_reduce_base`` where the reference's binding would take the call
    (``coc_impl.backends.ascend.check``), called here by :meth:`all_reduce_on_mc2`; everything else is the
    reference with ``backend="auto"``."""

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        from coc_impl.backends import ascend
        from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable
        from coc_impl.validated_call import ValidatedCall

        call = ValidatedCall.validate("matmul_all_reduce", x, w, bias, **kw)
        try:
            ascend.check(call)
        except (CoCBackendUnavailable, CoCArgumentError):
            return super().matmul_all_reduce(x, w, bias, **kw)
        if call.deterministic or call.antiquant is not None or call.blocks is not None:
            return super().matmul_all_reduce(x, w, bias, **kw)
        return self.all_reduce_on_mc2(call)

    def all_reduce_on_mc2(self, call: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def kernel(x1: Any, x2: Any, group: Any, **kw: Any) -> Any:
        """``npu_mm_all_reduce_base`` over ``group``'s HCCL communicator."""
        import torch
        import torch.distributed as dist

        hccl = group._get_backend(torch.device("npu"))
        hcom = hccl.get_hccl_comm_name(dist.get_global_rank(group, group.rank()))
        return torch.ops.npu.npu_mm_all_reduce_base(x1.contiguous(), x2, hcom, reduce_op="sum", **kw)


class BiasIntoAllReduceKernel(_CallsMc2Itself):
    """Hands the bias to ``npu_mm_all_reduce_base``, whose documented formula is ``allreduce(x1 @ x2 + bias)``:
    every rank adds it before the reduction, so the result carries it ``tp`` times."""

    name = "fault-bias-into-mc2-all-reduce"

    def all_reduce_on_mc2(self, call: Any) -> Any:
        return self.kernel(call.x, call.w.t() if call.transpose_weight else call.w, call.group, bias=call.bias)


class TransposeFlagLost(_CallsMc2Itself):
    """A weight stored ``[n, k]`` (``transpose_weight=True``) goes to the kernel as a contiguous copy of its storage,
    shaped ``[k, n]``: MC2 reads ``x2``'s transpose flag from its layout (the transposed view of an ND ``[n, k]``
    tensor), so without the view it multiplies by another matrix."""

    name = "fault-mc2-transpose-flag-lost"

    def all_reduce_on_mc2(self, call: Any) -> Any:
        x2 = call.w.contiguous().view(call.k, call.n) if call.transpose_weight else call.w
        return call.add_bias(self.kernel(call.x, x2, call.group))


class SecondMc2Domain(_CallsMc2Itself):
    """Overlaps two MC2 kernels by giving each half of the rows a communicator of its own (a duplicate of the TP
    group): on Atlas A2 every MC2 operator of a process must use one communication domain (CANN
    aclnnMatmulAllReduce), so the second half's kernel is refused."""

    name = "fault-second-mc2-domain"

    def __init__(self) -> None:
        super().__init__()
        self._duplicates: dict[tuple[int, ...], Any] = {}

    def all_reduce_on_mc2(self, call: Any) -> Any:
        import torch

        duplicate = _group_of_its_own(self._duplicates, call.group)
        w = call.w.t() if call.transpose_weight else call.w
        half = call.m // 2
        if not half:
            return call.add_bias(self.kernel(call.x, w, call.group))
        halves = [self.kernel(call.x[:half], w, call.group), self.kernel(call.x[half:], w, duplicate)]
        return call.add_bias(torch.cat(halves))
