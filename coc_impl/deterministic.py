"""Deterministic reduction: the definition, and its pipelined implementation.

``deterministic=True`` on ``matmul_all_reduce`` / ``matmul_reduce_scatter``
promises, as the protocol asks, the same bits for the same inputs and tiling
in any order the ranks arrive in; and, where this implementation declares it
(:mod:`coc_impl.split_invariance`), the same bits for any tiling.  A ring or
tree all-reduce cannot promise either -- its summation order depends on the
algorithm, the message size and so on the tiling -- so the result is
*defined* independently of how it is computed:

1. Each rank's partial is ``P_r = x_r.float() @ w_r.float()``: float32 inputs
   (float16 / bfloat16 are widened exactly; float32 is used as is) and float32
   accumulation, ``w_r`` being the logical ``[k, n]`` weight (the dequantised
   one under w8A16, see :mod:`coc_impl.quant`).
2. ``S = (((P_0 + P_1) + P_2) + ... + P_{tp-1})``: ascending rank order, in
   float32, elementwise.
3. ``S + bias.float()`` when there is a bias (added once, in float32).
4. One cast to the output dtype (``x``'s dtype).

Reduce-scatter keeps rows ``[r*m/tp, (r+1)*m/tp)`` of the result on rank ``r``.

The GEMM of step 1 must give every row the bits it has in one GEMM over all
``m`` rows, whatever tile it is computed in.  CPU BLAS (MKL) does not: float32
tiles of 1-3 rows (1-11 with two threads) differ bitwise from the same rows
inside a larger matmul, and so does *every* tile when ``n`` is not a multiple
of 8 (a transposed weight view then differs from a contiguous one too).  With
at least 16 rows and ``n`` padded to a multiple of 16, a row's bits no longer
depend on the tile size, its offset, the weight's storage or the thread count
(checked for CPU float32 at 1-8 threads; float16 / bfloat16 showed no effect).
So step 1 is, precisely, a float32 GEMM on zero-padded operands::

    P = (pad_rows(x.float(), MIN_GEMM_ROWS) @ pad_cols(w.float(), GEMM_COL_ALIGN))[:m, :n]

which is plain ``x.float() @ w.float()`` whenever ``m >= 16`` and ``n % 16 == 0``.
Agreement across runs and rank timings holds wherever that GEMM is
deterministic; across tilings, and with a serial reference computed
elsewhere, only where the device's GEMM gives a row the same bits at any row
count from 16 up -- measured, not promised (GPU libraries choose split-K
kernels by shape: :mod:`coc_shared.gemm_rows`).

The reduction is exact in its order, not in its transport: partial tiles are
exchanged as float32 (all-gather for all-reduce, all-to-all for
reduce-scatter) and summed locally in rank order, so no rank's timing can
reorder an addition.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

# The engine owns the all-gather launch (its name differs across torch releases).
from coc_impl.block_product import Product
from coc_impl.comm_lane import Pending
from coc_impl.reducers import launch_all_gather
from coc_impl.split_invariance import MIN_GEMM_ROWS

#: The float32 weight's columns are zero-padded to a multiple of this.
GEMM_COL_ALIGN = 16


def stable_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``, with ``a`` zero-padded to :data:`MIN_GEMM_ROWS` rows when thinner.

    Thin tiles would otherwise take a different BLAS kernel than the same rows
    inside a large matmul.
    """
    return stable_product(b)(a)


def stable_product(b: torch.Tensor) -> Product:
    """:func:`stable_matmul` by ``b`` as an engine :class:`~coc_impl.block_product.Product`."""
    return Product(b, min_rows=MIN_GEMM_ROWS)


def fp32_weight(w_kn: torch.Tensor) -> torch.Tensor:
    """The logical ``[k, n]`` weight in float32, contiguous, columns padded to :data:`GEMM_COL_ALIGN`.

    Built once per call; every tile's GEMM then sees the same operand.
    """
    pad = -w_kn.shape[1] % GEMM_COL_ALIGN
    return F.pad(w_kn.float(), (0, pad)).contiguous()


def fp32_partial(x_tile: torch.Tensor, w32: torch.Tensor, n: int) -> torch.Tensor:
    """Step 1 for one tile: its rows of ``P``, contiguous float32 ``[rows, n]``."""
    return stable_matmul(x_tile.float(), w32)[:, :n].contiguous()


def rank_ordered_sum(parts: Sequence[torch.Tensor] | torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Step 2: ``((parts[0] + parts[1]) + parts[2]) + ...``, into ``out`` if given."""
    if out is None:
        out = parts[0].clone()
    else:
        out.copy_(parts[0])
    for part in parts[1:]:
        out.add_(part)
    return out


class _SumOnWait:
    """A launched exchange of partials whose rank-ordered sum lands in ``out`` on wait."""

    def __init__(self, work: Pending, parts: torch.Tensor, out: torch.Tensor) -> None:
        self._work, self._parts, self._out = work, parts, out

    def wait(self) -> torch.Tensor:
        self._work.wait()
        return rank_ordered_sum(self._parts, self._out)


class RankOrderedReducer:
    """A :class:`~coc_impl.reducers.Reducer` that sums float32 partials in rank order.

    The partials move by pure data movement (all-gather, all-to-all), which is
    bit exact whatever the transport; the summation happens on wait, locally,
    in ascending rank order.  The price: float32 payloads, and an all-gather
    receives ``tp`` partials where a reduction would receive about one.
    """

    def all_reduce(self, partial: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup) -> Pending:
        parts = partial.new_empty((group.size(), *partial.shape))
        return _SumOnWait(launch_all_gather(parts.flatten(0, 1), partial, group), parts, out)

    def reduce_scatter(self, partial: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup) -> Pending:
        # Chunk j of every rank's partial goes to rank j; chunks arrive in source-rank order.
        received = torch.empty_like(partial)
        work = dist.all_to_all_single(received, partial, group=group, async_op=True)
        return _SumOnWait(work, received.view(group.size(), *out.shape), out)


def finish(total: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Steps 3 and 4: float32 bias once, then one cast to ``dtype``."""
    if bias is not None:
        total = total + bias.float()
    return total.to(dtype)
