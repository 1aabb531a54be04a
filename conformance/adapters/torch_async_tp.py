"""PyTorch's async-TP fused ops (``torch.distributed._symmetric_memory``) behind the plug-in protocol, on CPU.

``--coc-impl conformance.adapters.torch_async_tp:TorchAsyncTP``.  Async-TP
registers ``torch.ops.symm_mem.fused_all_gather_matmul`` and
``fused_matmul_reduce_scatter``; their pipelined kernels need CUDA symmetric
memory, and the only code that runs on a CPU is the functional-collective
fallback each op takes in test mode (``_fused_all_gather_matmul_fallback``,
``_fused_matmul_reduce_scatter_fallback``; registered for ``Meta`` only, so
there is no CPU kernel to dispatch to and the adapter calls the fallbacks).
They are imported from the installed torch, as that torch has them.

What maps: ``all_gather_matmul`` and ``all_gather_matmul_v2`` (the fallback
returns the gathered ``A`` when ``return_A``), and ``matmul_reduce_scatter``
(``reduce_op="sum"``).  Async-TP has no bias argument: the adapter adds the
bias after the op, as torch's own post-grad pass fuses only the matmul and
leaves the bias add to the graph.  Absent (their cases skip): a fused
matmul-all-reduce, a deterministic mode, explicit tilings, and megatron.core
layers (async-TP fuses by compiling a model, ``torch._inductor`` pattern
matching, not by replacing layers).  The fallbacks do not overlap: one
functional collective, waited, then the matmul (or the reverse).
"""

from __future__ import annotations

from typing import Any

from conformance.adapters.switch_only import SwitchOnlyAdapter


def _symm_mem() -> Any:
    try:
        from torch.distributed import _symmetric_memory
    except ImportError as exc:  # a torch built without distributed, or one older than async-TP
        raise ImportError(f"torch's async-TP ops are not available in this torch ({exc}): install a torch "
                          "with torch.distributed._symmetric_memory (2.5 or later)") from exc
    missing = [name for name in ("_fused_all_gather_matmul_fallback", "_fused_matmul_reduce_scatter_fallback")
               if not hasattr(_symmetric_memory, name)]
    if missing:
        raise ImportError(f"torch.distributed._symmetric_memory has no {missing} in this torch; "
                          "the adapter was written for torch 2.13")
    return _symmetric_memory


def _kn(w: Any, transpose_weight: bool) -> Any:
    """The protocol's weight as async-TP's ``B``, ``[k, n]``."""
    return w.t() if transpose_weight else w


def _with_bias(out: Any, bias: Any) -> Any:
    return out + bias if bias is not None else out


class TorchAsyncTP(SwitchOnlyAdapter):
    """torch's async-TP fallback ops (``torch.distributed._symmetric_memory``) as installed."""

    name = "torch-async-tp"

    def __init__(self) -> None:
        self._symm = _symm_mem()

    def _all_gather(self, x: Any, w: Any, *, group: Any, transpose_weight: bool) -> tuple[Any, Any]:
        gathered, (out,) = self._symm._fused_all_gather_matmul_fallback(
            x, [_kn(w, transpose_weight)], 0, group.group_name, return_A=True)
        return gathered, out

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, *, group: Any,
                          transpose_weight: bool = False) -> Any:
        return _with_bias(self._all_gather(x, w, group=group, transpose_weight=transpose_weight)[1], bias)

    def all_gather_matmul_v2(self, x: Any, w: Any, bias: Any = None, *, group: Any,
                             transpose_weight: bool = False) -> tuple[Any, Any]:
        gathered, out = self._all_gather(x, w, group=group, transpose_weight=transpose_weight)
        return _with_bias(out, bias), gathered

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
                              deterministic: bool = False) -> Any:
        if deterministic:
            raise NotImplementedError("torch async-TP's matmul-reduce-scatter has no deterministic mode")
        out = self._symm._fused_matmul_reduce_scatter_fallback(
            x, _kn(w, transpose_weight), "sum", 0, group.group_name)
        return _with_bias(out, bias)
