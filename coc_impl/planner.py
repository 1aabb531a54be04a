"""Chunk plans along the token axis ``m``: the MC2 tiling method and equal splits.

The MC2 method (``docs/DESIGN.md#tiling-planner``) cuts ``M`` rows
into one short block ``B`` and ``count`` equal long blocks ``A`` so that the two
pipeline lanes stay balanced:

1. The short block must still run efficiently.  Its candidates are
   ``a`` (smallest with ``a*K*N >= 4*1024**3``), ``b`` (smallest with
   ``b*K*N/1024 + b*N >= 6*1024**2``) and ``c = 3*128``.  The MC2 method's text takes
   the minimum, but its own worked example picks 384 = max(171, 192, 384): each
   inequality is a lower bound below which a block is too small to be
   efficient, so all must hold and ``m0 = max(a, b, c)``.
2. ``t0 = CostMM(m0)*inflation`` and ``t1 = CostComm(m0)*inflation``; the
   inflation covers the memory-bandwidth contention of overlapped lanes.
3. Comm-bound if ``CostComm(M) > CostMM(M)``.  The long block then multiplies in
   the time the short block communicates (``CostMM(m1) = t1``), so the short
   block goes first and the comm lane never waits (BAAA).  Compute-bound: the
   long block communicates in the time the short one multiplies
   (``CostComm(m1) = t0``) and the short block goes last, keeping the exposed
   comm tail short (AAAB).  ``m1`` is aligned down to 128 rows (at least 128),
   the granularity the matmul kernels are efficient at.
4. ``count = floor((M - m0)/m1)``; ``m1 = floor128((M - m0)/count)``;
   ``m0 = M - m1*count`` absorbs the remainder.

When no split fits (``M <= m0``, ``count == 0``) the plan is one block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from coc_impl.errors import CoCShapeError
from coc_shared.cost_curves import CostCurve
from coc_shared.cost_model import CommCost, MatmulCost

Bound = Literal["comm", "compute"]

#: Row granularity of long blocks.
ROW_ALIGN = 128
#: Candidate ``c``: the MC2 method's fixed minimum short block (3 * 128 rows).
MIN_SHORT_ROWS = 3 * ROW_ALIGN
DEFAULT_INFLATION = 1.15


@dataclass(frozen=True)
class Plan:
    """Chunk sizes along ``m``; ``count`` long blocks of ``m1`` rows and one of ``m0``.

    A single-block plan has ``m0 == M``, ``m1 == 0`` and ``count == 0``.
    """

    blocks: tuple[int, ...]
    bound: Bound
    m0: int
    m1: int
    count: int


def short_block_candidates(k: int, n: int) -> tuple[int, int, int]:
    """The MC2 method's lower bounds ``(a, b, c)`` on the short block, in rows."""
    a = _ceil_div(4 * 1024**3, k * n)
    # b*K*N/1024 + b*N >= 6*1024**2  <=>  b*N*(K + 1024) >= 6*1024**3
    b = _ceil_div(6 * 1024**3, n * (k + 1024))
    return a, b, MIN_SHORT_ROWS


def short_block_rows(k: int, n: int) -> int:
    """``m0``: every candidate is a lower bound, so the largest of them."""
    return max(short_block_candidates(k, n))


def plan_blocks(
    M: int,
    K: int,
    N: int,
    dtype_size: int,
    mm_cost: CostCurve,
    comm_cost: CostCurve,
    inflation: float = DEFAULT_INFLATION,
) -> Plan:
    """Plan the chunks of a ``[M, K] @ [K, N]`` matmul overlapped with its collective.

    ``mm_cost`` and ``comm_cost`` give microseconds for ``m`` rows of this
    shape (see :meth:`coc_shared.cost_model.CostModels.bind`); row costs bound to
    another shape are rejected.
    """
    for name, value in (("M", M), ("K", K), ("N", N), ("dtype_size", dtype_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CoCShapeError(f"{name} must be a positive integer, got {value!r}")
    if not (inflation > 0 and math.isfinite(inflation)):
        raise ValueError(f"inflation must be a positive finite factor, got {inflation!r}")
    _check_binding(K, N, dtype_size, mm_cost, comm_cost)

    bound: Bound = "comm" if comm_cost(M) > mm_cost(M) else "compute"
    m0 = short_block_rows(K, N)
    if m0 >= M:
        return _single(M, bound)
    if bound == "comm":
        m1_exact = mm_cost.solve(comm_cost(m0) * inflation)
    else:
        m1_exact = comm_cost.solve(mm_cost(m0) * inflation)
    if not math.isfinite(m1_exact):
        return _single(M, bound)
    m1 = max(ROW_ALIGN, _align_down(int(m1_exact)))
    count = (M - m0) // m1
    if count == 0:
        return _single(M, bound)
    m1 = _align_down((M - m0) // count)  # >= the aligned m1 above, so >= 128
    m0 = M - m1 * count
    longs = (m1,) * count
    blocks = (m0, *longs) if bound == "comm" else (*longs, m0)
    return Plan(blocks, bound, m0, m1, count)


def _check_binding(K: int, N: int, dtype_size: int, mm_cost: CostCurve, comm_cost: CostCurve) -> None:
    if isinstance(mm_cost, MatmulCost) and (mm_cost.k, mm_cost.n) != (K, N):
        raise CoCShapeError(
            f"matmul cost is for k={mm_cost.k}, n={mm_cost.n} but the plan is for K={K}, N={N}; "
            "use MatmulCost.for_shape or CostModels.bind"
        )
    if isinstance(comm_cost, CommCost) and (comm_cost.n, comm_cost.dtype_size) != (N, dtype_size):
        raise CoCShapeError(
            f"comm cost is for rows of n={comm_cost.n} x {comm_cost.dtype_size} bytes "
            f"but the plan is for N={N} x {dtype_size} bytes"
        )


def _single(M: int, bound: Bound) -> Plan:
    return Plan((M,), bound, M, 0, 0)


def _align_down(rows: int) -> int:
    return rows // ROW_ALIGN * ROW_ALIGN


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
