"""Portable backend of the fused ops: a tiling plan executed by the overlap engine.

Runs wherever ``torch.distributed`` does (gloo on CPU, nccl on CUDA, hccl on
NPU) and at any TP size, so the fused semantics of SPEC section 4 are testable
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
:class:`~coc_impl.deterministic.RankOrderedReducer`.  The arguments are the
ones validated by :mod:`coc_impl.fused`; call through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from coc_impl import overlap
from coc_impl.deterministic import RankOrderedReducer, finish, fp32_partial, fp32_weight, stable_product
from coc_impl.planner import ROW_ALIGN, plan_blocks
from coc_impl.quant import check_antiquant, dequantize
from coc_shared.cost_model import CommCost, CostModels

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


def _weight_kn(w: Tensor, transpose_weight: bool) -> Tensor:
    """The logical ``[k, n]`` weight (a view; the flag decides, never the shape)."""
    return w.t() if transpose_weight else w


def _summed_product(
    pipeline: Callable[..., overlap.InFlight[Tensor]],
    x: Tensor,
    w_kn: Tensor,
    bias: Tensor | None,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    deterministic: bool,
) -> Tensor:
    """``pipeline`` (all-reduce or reduce-scatter) of ``x @ w_kn``, then the bias once.

    Deterministic: float32 partials summed in rank order, one cast at the end.
    """
    if deterministic:
        w32, n = fp32_weight(w_kn), w_kn.shape[1]
        total = pipeline(
            x, lambda tile: fp32_partial(tile, w32, n), blocks, group, reducer=RankOrderedReducer()
        ).wait()
        return finish(total, bias, x.dtype)
    return _add_bias(pipeline(x, stable_product(w_kn), blocks, group).wait(), bias)


def matmul_all_reduce(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    deterministic: bool = False,
    antiquant_scale: Tensor | None = None,
    antiquant_offset: Tensor | None = None,
    antiquant_group_size: int = 0,
    blocks: Sequence[int] | None = None,
) -> Tensor:
    """``allreduce_sum(x @ w) + bias``; an int8 ``w`` is dequantised once per call."""
    antiquant = check_antiquant(
        x, w, antiquant_scale, antiquant_offset, antiquant_group_size, transpose_weight=transpose_weight
    )
    if antiquant is not None:
        w = dequantize(w, antiquant, transpose_weight=transpose_weight)
    w_kn = _weight_kn(w, transpose_weight)
    m, (k, n) = x.shape[0], w_kn.shape
    if blocks is None:
        blocks = plan(m, 1, k, n, x.element_size())
    return _summed_product(overlap.matmul_all_reduce, x, w_kn, bias, blocks, group, deterministic)


def matmul_reduce_scatter(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    deterministic: bool = False,
    blocks: Sequence[int] | None = None,
) -> Tensor:
    """``reduce_scatter_sum(x @ w)`` along ``m`` (+ bias once); ``blocks`` tile ``m/tp``."""
    tp = group.size()
    w_kn = _weight_kn(w, transpose_weight)
    m, (k, n) = x.shape[0], w_kn.shape
    if blocks is None:
        blocks = plan(m // tp, tp, k, n, x.element_size())
    return _summed_product(overlap.matmul_reduce_scatter, x, w_kn, bias, blocks, group, deterministic)


def all_gather_matmul(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    blocks: Sequence[int] | None = None,
) -> Tensor:
    """``all_gather(x) @ w + bias`` (the gathered ``x`` is not kept)."""
    return _all_gather_matmul(x, w, bias, group, transpose_weight, blocks, keep_gathered=False)[0]


def all_gather_matmul_v2(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    blocks: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """``(all_gather(x) @ w + bias, all_gather(x))``, rows rank-major."""
    out, gathered = _all_gather_matmul(x, w, bias, group, transpose_weight, blocks, keep_gathered=True)
    assert gathered is not None
    return out, gathered


def _all_gather_matmul(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    group: dist.ProcessGroup,
    transpose_weight: bool,
    blocks: Sequence[int] | None,
    *,
    keep_gathered: bool,
) -> tuple[Tensor, Tensor | None]:
    w_kn = _weight_kn(w, transpose_weight)
    m, (k, n) = x.shape[0], w_kn.shape
    if blocks is None:
        blocks = plan(m, group.size(), k, n, x.element_size(), comm_width=k)
    out, gathered = overlap.all_gather_matmul(
        x, stable_product(w_kn), blocks, group, keep_gathered=keep_gathered
    )
    return _add_bias(out, bias), gathered


def _add_bias(out: Tensor, bias: Tensor | None) -> Tensor:
    """Once, after the collective, in the output dtype (one rounding)."""
    return out if bias is None else out.add_(bias)
