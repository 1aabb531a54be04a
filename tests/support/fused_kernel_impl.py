"""A correct implementation whose all-reduce and reduce-scatter multiply through kernels registered as torch_npu's
MC² kernels (``torch.ops.npu.npu_mm_all_reduce_base``, ``npu_mm_reduce_scatter_base``), run on the CPU.

Each kernel here is only the local matmul (the collective follows as a ``torch.distributed`` call), but it is
dispatched under the name and namespace torch_npu registers, so the suite's count of fused kernels
(``docs/DESIGN.md#fused-ops``) must find it per case: in the all-reduce and reduce-scatter cases, and in no
all-gather one.  Defining ops under ``npu`` belongs to torch_npu on an NPU node: load this only where no
torch_npu is (a suite run's own session and ranks).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.distributed as dist

from coc_impl.reference import ReferenceCoC
from coc_impl.validated_call import ValidatedCall

#: The kernels, as ``name(Tensor x1, Tensor x2, str hcom) -> Tensor`` computing ``x1 @ x2`` (the local part).
KERNELS = ("npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base")
_LIBRARIES: list[torch.library.Library] = []


def _define() -> None:
    if "torch_npu" in sys.modules:
        raise RuntimeError("torch_npu owns torch.ops.npu here: this stand-in is for CPU sessions only")
    library = torch.library.Library("npu", "FRAGMENT")
    for kernel in KERNELS:
        if not hasattr(torch.ops.npu, kernel):
            library.define(f"{kernel}(Tensor x1, Tensor x2, str hcom) -> Tensor")
            library.impl(kernel, lambda x1, x2, hcom: torch.matmul(x1, x2), "CPU")
    _LIBRARIES.append(library)


_define()


class ReachesNpuNamedKernels(ReferenceCoC):
    """The all-reduce and reduce-scatter through the kernels above, then the collective and the bias once."""

    name = "reaches-npu-named-kernels"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        call = ValidatedCall.validate("matmul_all_reduce", x, w, bias, **kw)
        if call.deterministic or call.antiquant is not None or call.blocks is not None:
            return super().matmul_all_reduce(x, w, bias, **kw)
        out = torch.ops.npu.npu_mm_all_reduce_base(call.x, self._kn(call), "hcom")
        dist.all_reduce(out, group=call.group)
        return call.add_bias(out)

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        call = ValidatedCall.validate("matmul_reduce_scatter", x, w, bias, **kw)
        if call.deterministic or call.blocks is not None:
            return super().matmul_reduce_scatter(x, w, bias, **kw)
        product = torch.ops.npu.npu_mm_reduce_scatter_base(call.x, self._kn(call), "hcom")
        out = product.new_empty((call.m // call.tp, call.n))
        dist.reduce_scatter_tensor(out, product, group=call.group)
        return call.add_bias(out)

    @staticmethod
    def _kn(call: ValidatedCall) -> Any:
        return call.w.t() if call.transpose_weight else call.w
