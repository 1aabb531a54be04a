"""Scripted CoC: the TP linear layers as autograd functions over the overlap engine.

Every cell of the layout table (``docs/DESIGN.md#layouts``), forward and backward:

============  ==========================================  ===============================================
layer, mode   forward                                     backward
============  ==========================================  ===============================================
Column        ``y = x @ w.T`` (no collective)             ``dx = dy @ w`` chunked + all-reduce; ``dw``
Column, SP    all-gather(x) chunked, communicate-first    ``dx`` chunked + reduce-scatter; ``dw`` from the
                                                          re-gathered (or saved) x
Row           ``x @ w.T`` chunked + all-reduce            ``dx = dy @ w``, ``dw`` (no collective)
Row, SP       ``x @ w.T`` chunked + reduce-scatter        all-gather(dy) chunked, then ``dx``, ``dw``
============  ==========================================  ===============================================

Weights are megatron's ``[out, in]`` and the layers compute ``x @ w.T``;
transposition is fixed by the layer, never guessed from shapes.  Which row
blocks a pipelined matmul is cut into is a :class:`~coc_impl.block_policy.BlockPolicy`
(:mod:`coc_impl.block_policy`; by default the scripted form's equal chunks).  The
fused kernel's layers (:mod:`coc_impl.fused`) are these same autograd functions
under a tiling-plan policy.  Biases are added outside the collectives, once (column: per
shard; row: after the reduction), and autograd derives their gradients.

``matmul_soc_friendly`` zero-pads the contraction axis ``k`` of both operands
to a 512-byte multiple (when that costs at most 1/8 more work), as the
upstream feature does for NPU-friendly strides.  The padded terms are exact
zeros, so results equal the unpadded matmul up to the BLAS's summation order
for the longer ``k``: equal within floating-point rounding, not guaranteed
bit for bit.  Chunking alone (row blocks) does not change any row's sum.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from coc_impl.block_policy import BlockPolicy, LayerCall, LayerCallKeywords, MatmulSite, chunked_blocks
from coc_impl.block_product import Matmul, Product
from coc_impl.comm_lane import InFlight
from coc_impl.errors import CoCShapeError
from coc_impl.overlap import all_gather, all_gather_matmul, matmul_all_reduce, matmul_reduce_scatter

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack

# Same autocast behaviour as megatron's own linear autograd function.
_custom_fwd = partial(torch.amp.custom_fwd, device_type="cuda")
_custom_bwd = partial(torch.amp.custom_bwd, device_type="cuda")

#: Row stride (bytes) the soc-friendly re-lay aligns the contraction axis to.
SOC_ALIGN_BYTES = 512


def soc_friendly_k(k: int, itemsize: int) -> int:
    """The contraction length after soc-friendly padding (``k`` if not worth it)."""
    per_align = max(1, SOC_ALIGN_BYTES // itemsize)
    padded = -(-k // per_align) * per_align
    return padded if padded - k <= k // 8 else k


def rows_times(right: torch.Tensor, *, soc_friendly: bool) -> Matmul:
    """A :data:`~coc_impl.block_product.Matmul` computing ``rows @ right`` (``right`` is ``[k, n]``).

    Outside autocast it is a :class:`~coc_impl.block_product.Product`, so the engine
    multiplies straight into the result; under autocast the matmul must pick
    its own output dtype, so it stays a plain function.
    """
    k = right.shape[0]
    padded = soc_friendly_k(k, right.element_size()) if soc_friendly else k
    if padded != k:
        right = F.pad(right.t(), (0, padded - k)).t()  # zero rows appended along k
    product = Product(right, pad_k=padded - k)
    return product.__call__ if torch.is_autocast_enabled(right.device.type) else product


def _weight_grad(
    weight: torch.Tensor, grad_output: torch.Tensor, total_input: torch.Tensor, fusion: bool
) -> torch.Tensor | None:
    """``dy.T @ x``, or megatron's gradient-accumulation fusion into ``weight.main_grad``.

    With the fusion the product is accumulated into ``main_grad`` (in its
    dtype, fp32 normally) and no gradient is returned, except the dummy
    megatron returns when the weight tracks ``grad_added_to_main_grad``.
    """
    if not (fusion and hasattr(weight, "main_grad")):
        return grad_output.t().matmul(total_input)
    main_grad = weight.main_grad
    main_grad.addmm_(grad_output.t().to(main_grad.dtype), total_input.to(main_grad.dtype))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    weight.grad_added_to_main_grad = True
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    return make(main_grad.shape, dtype=total_input.dtype, device=total_input.device)


def _summing(call: LayerCall, m: int) -> tuple[str, Callable[..., InFlight[torch.Tensor]], int]:
    """The collective that sums a matmul's ``m`` output rows over the group (reduce-scatter under SP, else
    all-reduce): its name, its pipeline, and the rows its blocks split (each rank's shard under SP)."""
    if call.sequence_parallel:
        return "reduce-scatter", matmul_reduce_scatter, m // call.tp
    return "all-reduce", matmul_all_reduce, m


def _backward_start(
    ctx: Any, grad_output: torch.Tensor
) -> tuple[LayerCall, torch.Tensor, torch.Tensor, bool, bool, torch.Tensor]:
    """Where both layers' backwards start: the call, the saved input and weight, whether ``dx`` and ``dw`` are
    wanted, and ``dy`` made contiguous."""
    saved_input, weight = ctx.saved_tensors
    needs_dx, needs_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    return ctx.call, saved_input, weight, needs_dx, needs_dw, grad_output.contiguous()


class _ColumnParallelMatmul(torch.autograd.Function):
    """``x @ w.T`` of a column-parallel layer on 2-D rows (w: this rank's ``[out/tp, in]``)."""

    @staticmethod
    @_custom_fwd
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, call: LayerCall) -> torch.Tensor:
        ctx.call = call
        ctx.recomputes_gather = False
        if not call.sequence_parallel:
            ctx.save_for_backward(x, weight)
            return torch.matmul(x, weight.t())
        blocks = call.blocks(MatmulSite(
            "ColumnParallelLinear forward (all-gather x)", m=x.shape[0] * call.tp,
            k=weight.shape[1], n=weight.shape[0], split_rows=x.shape[0],
            itemsize=x.element_size(), device=x.device, gathers=True,
        ))
        keep_gathered = not call.config.user_cfgs.recompute_all_gather
        output, gathered = all_gather_matmul(
            x, rows_times(weight.t(), soc_friendly=call.soc_friendly), blocks, call.group,
            keep_gathered=keep_gathered,
        )
        ctx.recomputes_gather = not keep_gathered
        ctx.save_for_backward(gathered if keep_gathered else x, weight)
        return output

    @staticmethod
    @_custom_bwd
    def backward(ctx, grad_output: torch.Tensor):
        call, saved_input, weight, needs_dx, needs_dw, grad_output = _backward_start(ctx, grad_output)
        m = grad_output.shape[0]
        collective, pipeline, split_rows = _summing(call, m)
        site = MatmulSite(f"ColumnParallelLinear backward (dx {collective})", m=m, k=weight.shape[0],
                          n=weight.shape[1], split_rows=split_rows,
                          itemsize=grad_output.element_size(), device=grad_output.device, column_backward=True)
        # Blocks (and their shape check) before any collective of the backward.
        blocks = call.blocks(site) if needs_dx else None
        total_input = None
        if needs_dw and ctx.recomputes_gather:
            # Launched before the dx pipeline so it overlaps with it, as megatron does.
            total_input = all_gather(saved_input, [saved_input.shape[0]], call.group)
        grad_input = None
        if blocks is not None:
            dx_matmul = rows_times(weight, soc_friendly=call.soc_friendly)
            grad_input = pipeline(grad_output, dx_matmul, blocks, call.group)
        grad_weight = None
        if needs_dw:
            total = total_input.wait() if total_input is not None else saved_input
            grad_weight = _weight_grad(weight, grad_output, total, call.gradient_accumulation_fusion)
        return (grad_input.wait() if grad_input is not None else None), grad_weight, None


class _RowParallelMatmul(torch.autograd.Function):
    """``x @ w.T`` of a row-parallel layer on 2-D rows (w: this rank's ``[out, in/tp]``)."""

    @staticmethod
    @_custom_fwd
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, call: LayerCall) -> torch.Tensor:
        ctx.call = call
        ctx.save_for_backward(x, weight)
        matmul = rows_times(weight.t(), soc_friendly=call.soc_friendly)
        collective, pipeline, split_rows = _summing(call, x.shape[0])
        blocks = call.blocks(MatmulSite(f"RowParallelLinear forward ({collective})", m=x.shape[0], k=weight.shape[1],
                                        n=weight.shape[0], split_rows=split_rows, itemsize=x.element_size(),
                                        device=x.device))
        return pipeline(x, matmul, blocks, call.group).wait()

    @staticmethod
    @_custom_bwd
    def backward(ctx, grad_output: torch.Tensor):
        call, x, weight, needs_dx, needs_dw, grad_output = _backward_start(ctx, grad_output)
        grad_input = None
        if call.sequence_parallel:
            blocks = call.blocks(MatmulSite(
                "RowParallelLinear backward (dy all-gather)", m=grad_output.shape[0] * call.tp,
                k=weight.shape[0], n=weight.shape[1], split_rows=grad_output.shape[0],
                itemsize=grad_output.element_size(), device=grad_output.device, gathers=True,
            ))
            grad_input, total_grad_output = all_gather_matmul(
                grad_output, rows_times(weight, soc_friendly=call.soc_friendly), blocks,
                call.group, keep_gathered=needs_dw,
            )
        else:
            total_grad_output = grad_output
            if needs_dx:
                grad_input = grad_output.matmul(weight)
        grad_weight = None
        if needs_dw:
            assert total_grad_output is not None
            grad_weight = _weight_grad(weight, total_grad_output, x, call.gradient_accumulation_fusion)
        return (grad_input if needs_dx else None), grad_weight, None


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _layer_output(rows: torch.Tensor, lead: tuple[int, ...], bias: torch.Tensor | None) -> torch.Tensor:
    """The layer's output rows in the input's leading shape ``lead``, the bias (if any) added once."""
    output = rows.view(*lead, rows.shape[-1])
    return output + bias if bias is not None else output


def column_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, policy: BlockPolicy = chunked_blocks,
    **keywords: Unpack[LayerCallKeywords],
) -> torch.Tensor:
    """Column-parallel linear with its collectives chunked and overlapped.

    ``x``: ``[s, b, in]`` (or any ``[..., in]``; with SP this rank's sequence
    shard), ``weight``: this rank's ``[out/tp, in]``, ``bias``: this rank's
    ``[out/tp]`` or None.  Returns ``[s*tp if SP else s, b, out/tp]``.
    Backward all-reduces (no SP) or reduce-scatters (SP) ``dx``.  ``policy``
    cuts each pipelined matmul into row blocks.
    """
    call = LayerCall(policy=policy, **keywords)
    rows = _ColumnParallelMatmul.apply(_as_rows(x), weight, call)
    lead = (x.shape[0] * call.tp, *x.shape[1:-1]) if call.sequence_parallel else x.shape[:-1]
    return _layer_output(rows, lead, bias)


def row_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, policy: BlockPolicy = chunked_blocks,
    **keywords: Unpack[LayerCallKeywords],
) -> torch.Tensor:
    """Row-parallel linear with its collectives chunked and overlapped.

    ``x``: ``[s, b, in/tp]`` (already split along the hidden axis),
    ``weight``: this rank's ``[out, in/tp]``, ``bias``: the full ``[out]``,
    added once after the reduction.  Returns ``[s/tp if SP else s, b, out]``.
    ``policy`` cuts each pipelined matmul into row blocks.
    """
    call = LayerCall(policy=policy, **keywords)
    if call.sequence_parallel and x.shape[0] % call.tp != 0:
        raise CoCShapeError(
            f"CoC: RowParallelLinear forward (reduce-scatter): sequence length {x.shape[0]} "
            f"(m={x.shape[:-1].numel()}) is not a multiple of tp={call.tp}"
        )
    rows = _RowParallelMatmul.apply(_as_rows(x), weight, call)
    lead = (x.shape[0] // call.tp, *x.shape[1:-1]) if call.sequence_parallel else x.shape[:-1]
    return _layer_output(rows, lead, bias)
