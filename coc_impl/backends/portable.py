"""Portable backend of the fused ops: a tiling plan executed by the overlap engine.

Runs wherever ``torch.distributed`` does (gloo on CPU, nccl on CUDA, hccl on
NPU) and at any TP size, so the fused semantics (``docs/DESIGN.md#fused-ops``) are testable
without Ascend hardware.  Each op multiplies and communicates block by block
through :mod:`coc_impl.overlap` with real asynchronous collectives
(compute-first for all-reduce / reduce-scatter, communicate-first for
all-gather).

Tiled axis: ``m`` for ``matmul_all_reduce``; each rank's ``m/tp`` output rows
for ``matmul_reduce_scatter``; each rank's ``m`` input rows for the gathers.
An explicit ``blocks`` is executed exactly.  Without it the plan comes from
:func:`coc_impl.planner.plan_blocks` when cost models were installed with
:func:`set_cost_models`, else from :func:`default_blocks`.

Matmuls go through :func:`~coc_impl.deterministic.stable_matmul`, so a thin
tile gets the bits the same rows would get in one large matmul; with
``deterministic=True`` the tiles are float32 partials reduced by
:class:`~coc_impl.deterministic.RankOrderedReducer`.  :func:`run` takes a
call already validated (:mod:`coc_impl.validated_call`) and checks nothing again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from coc_impl import overlap
from coc_impl.deterministic import RankOrderedReducer, finish, fp32_partial, fp32_weight, stable_product
from coc_impl.planner import ROW_ALIGN, plan_blocks
from coc_impl.quant import dequantize
from coc_shared.cost_model import CommCost, CostModels

if TYPE_CHECKING:
    from coc_impl.validated_call import ValidatedCall

Tensor = torch.Tensor

#: Upper bound of blocks in the default plan (more only adds launch overhead on CPU).
DEFAULT_MAX_BLOCKS = 4

_cost_models: CostModels | None = None


def set_cost_models(models: CostModels | None) -> None:
    """Install measured cost models for ``blocks=None`` planning (``None`` removes them)."""
    global _cost_models
    _cost_models = models


def default_blocks(rows: int) -> tuple[int, ...]:
    """Up to :data:`DEFAULT_MAX_BLOCKS` equal 128-aligned blocks, the last one shorter.

    Fewer than ``2*128`` rows stay one block: below that the matmul is too
    small for a split to pay.
    """
    if rows < 2 * ROW_ALIGN:
        return (rows,)
    parts = min(DEFAULT_MAX_BLOCKS, rows // ROW_ALIGN)
    size = -(-rows // parts)
    size = -(-size // ROW_ALIGN) * ROW_ALIGN
    full, rest = divmod(rows, size)
    return (size,) * full + ((rest,) if rest else ())


def plan(
    shard_rows: int, tp_factor: int, k: int, n: int, dtype_size: int, comm_width: int | None = None
) -> tuple[int, ...]:
    """Blocks over ``shard_rows`` rows, each standing for ``tp_factor`` matmul rows.

    The planner's costs are per matmul row, so it plans the
    ``shard_rows*tp_factor`` rows actually multiplied and the blocks are
    divided back (the remainder of the division goes to the last block).
    ``comm_width`` is the width of the communicated rows when it is not ``n``
    (all-gather moves ``x``'s rows, of width ``k``).
    """
    if _cost_models is None:
        return default_blocks(shard_rows)
    mm_cost, comm_cost = _cost_models.bind(k, n, dtype_size)
    if comm_width is not None and comm_width != n:
        # Same payload in the planner's units: m rows of width comm_width = m*comm_width/n rows of n.
        comm_cost = CommCost(comm_cost.fit.rescaled(comm_width / n), n, dtype_size)
    planned = plan_blocks(shard_rows * tp_factor, k, n, dtype_size, mm_cost, comm_cost).blocks
    blocks = [b // tp_factor for b in planned]
    blocks[-1] += shard_rows - sum(blocks)
    return tuple(b for b in blocks if b > 0)


def run(call: ValidatedCall) -> Tensor | tuple[Tensor, Tensor]:
    """Execute one call validated by :meth:`coc_impl.validated_call.ValidatedCall.validate`."""
    w_kn = _weight_kn(call)
    k, n, itemsize = call.k, call.n, call.x.element_size()
    if call.op in ("all_gather_matmul", "all_gather_matmul_v2"):
        keep = call.op == "all_gather_matmul_v2"
        blocks = call.blocks or plan(call.tiled_rows, call.tp, k, n, itemsize, comm_width=k)
        out, gathered = overlap.all_gather_matmul(
            call.x, stable_product(w_kn), blocks, call.group, keep_gathered=keep
        )
        if keep:
            assert gathered is not None
            return call.add_bias(out), gathered
        return call.add_bias(out)
    if call.op == "matmul_all_reduce":
        pipeline, factor = overlap.matmul_all_reduce, 1
    else:
        pipeline, factor = overlap.matmul_reduce_scatter, call.tp
    blocks = call.blocks or plan(call.tiled_rows, factor, k, n, itemsize)
    if call.deterministic:
        # Float32 partials summed in rank order, one cast at the end.
        w32 = fp32_weight(w_kn)
        total = pipeline(
            call.x, lambda tile: fp32_partial(tile, w32, n), blocks, call.group, reducer=RankOrderedReducer()
        ).wait()
        return finish(total, call.bias, call.x.dtype)
    return call.add_bias(pipeline(call.x, stable_product(w_kn), blocks, call.group).wait())


def _weight_kn(call: ValidatedCall) -> Tensor:
    """The logical ``[k, n]`` float weight: a view, dequantised once per call under w8A16."""
    w = call.w
    if call.antiquant is not None:
        w = dequantize(w, call.antiquant, transpose_weight=call.transpose_weight)
    return w.t() if call.transpose_weight else w
