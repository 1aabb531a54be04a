"""The overlap engine: a matmul pipelined with its collective over blocks of rows.

Shared by the scripted CoC form and the portable fused backend, which executes
a tiling plan of *unequal* blocks; so every entry point takes ``blocks`` (row
counts summing exactly to the split axis) rather than a chunk count.  Blocks
are validated up front, so no output row is ever left unwritten.

Two orders:

* compute-first, for all-reduce and reduce-scatter: multiply block *i*, launch
  its collective, go on to block *i+1*; wait for everything as late as
  possible (the caller gets an :class:`InFlight` and decides when).
* communicate-first, for all-gather: launch the gather of block *i+1*, then
  multiply block *i* (whose gather was launched one step earlier).

Layouts equal the serial collectives exactly.  The split axis is dim 0; for
gathers and reduce-scatters it is the per-rank shard, viewed as
``[tp, shard_rows, ...]`` globally, and block *i* covers rows ``s:s+b`` of every
rank's shard: chunked all-gather rows come out rank-major like one serial
``all_gather`` along dim 0, and chunked reduce-scatter leaves on each rank
exactly the rows a serial ``reduce_scatter`` would.

The engine multiplies with a :mod:`coc_impl.block_product` (a :class:`Product`
writes each block straight into its rows of the result, and the all-reduce
pipeline sums those rows in place, like the serial ``all_reduce(x @ w)``), sums
with a :mod:`coc_impl.reducers` reducer and launches its collectives on a
:mod:`coc_impl.comm_lane` lane.  ``matmul=None`` runs the collective alone, pipelined.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial as bind
from typing import NamedTuple

import torch
import torch.distributed as dist

from coc_impl.block_product import Matmul, Product
from coc_impl.comm_lane import CommLane, InFlight, Pending
from coc_impl.errors import CoCShapeError
from coc_impl.reducers import SUM_REDUCER, CollectiveReducer, Reducer, launch_all_gather


class GatherMatmulResult(NamedTuple):
    """Outputs of :func:`all_gather_matmul`."""

    output: torch.Tensor
    gathered: torch.Tensor | None


def validate_blocks(blocks: Sequence[int], total: int, *, what: str) -> tuple[int, ...]:
    """Blocks as a tuple of positive ints summing exactly to ``total``."""
    blocks = tuple(blocks)
    if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in blocks):
        raise CoCShapeError(f"{what}: blocks must be positive row counts, got {list(blocks)}")
    if sum(blocks) != total:
        raise CoCShapeError(
            f"{what}: blocks {list(blocks)} sum to {sum(blocks)}, not to the {total} rows to split"
        )
    return blocks


def equal_blocks(total: int, parts: int, *, what: str = "split") -> list[int]:
    """``parts`` equal blocks of ``total`` rows (a :class:`CoCShapeError` if uneven)."""
    if parts < 1 or total % parts != 0:
        raise CoCShapeError(f"{what}: {total} rows cannot be split into {parts} equal blocks")
    return [total // parts] * parts


def _offsets(blocks: Sequence[int]) -> list[tuple[int, int]]:
    spans, start = [], 0
    for b in blocks:
        spans.append((start, b))
        start += b
    return spans


def _shard_rows(rows: int, tp: int, *, what: str) -> int:
    if rows % tp != 0:
        raise CoCShapeError(f"{what}: {rows} rows cannot be reduce-scattered over tp={tp} ranks")
    return rows // tp


def _check_out(out: torch.Tensor, shape: Sequence[int], *, what: str) -> None:
    if tuple(out.shape) != tuple(shape) or not out.is_contiguous():
        raise CoCShapeError(
            f"{what}: out must be a contiguous tensor of shape {tuple(shape)}, "
            f"got {tuple(out.shape)} (contiguous={out.is_contiguous()})"
        )


def matmul_all_reduce(
    x: torch.Tensor,
    matmul: Matmul | None,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    *,
    reducer: Reducer = SUM_REDUCER,
    out: torch.Tensor | None = None,
) -> InFlight[torch.Tensor]:
    """``all_reduce(matmul(x))`` pipelined compute-first over row ``blocks`` of ``x``.

    ``matmul=None`` all-reduces ``x`` itself (a plain pipelined all-reduce).
    """
    what = "matmul_all_reduce"
    spans = _offsets(validate_blocks(blocks, x.shape[0], what=what))
    lane = CommLane(x.device)
    # A Product writes every block into the result and the sum reduces it in place.
    direct = matmul if isinstance(matmul, Product) and isinstance(reducer, CollectiveReducer) else None
    if direct is not None:
        out = direct.empty(x) if out is None else out
        _check_out(out, (x.shape[0], direct.right.shape[1]), what=what)
    pending: list[Pending] = []
    for start, rows in spans:
        part = x[start : start + rows]
        if direct is not None and out is not None:
            partial = direct.into(part, out[start : start + rows])
        else:
            partial = (matmul(part) if matmul is not None else part).contiguous()
        if out is None:
            fresh = partial.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
            # One block: reduce a freshly computed product in place instead of copying it.
            single_fresh = len(spans) == 1 and fresh
            out = partial if single_fresh else partial.new_empty((x.shape[0], *partial.shape[1:]))
        elif start == 0 and direct is None:
            _check_out(out, (x.shape[0], *partial.shape[1:]), what=what)
        target = out[start : start + rows]
        pending.append(lane.launch(bind(reducer.all_reduce, partial, target, group), partial, target))
    assert out is not None  # blocks are never empty
    return InFlight(out, lane, pending)


def matmul_reduce_scatter(
    x: torch.Tensor,
    matmul: Matmul | None,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    *,
    reducer: Reducer = SUM_REDUCER,
    out: torch.Tensor | None = None,
) -> InFlight[torch.Tensor]:
    """``reduce_scatter(matmul(x))`` along dim 0, pipelined compute-first.

    ``blocks`` split the per-rank shard (``x.shape[0] / tp`` rows).  Block
    ``[s, s+b)`` multiplies rows ``s:s+b`` of every rank's shard of ``x`` and
    reduce-scatters them into rows ``s:s+b`` of this rank's output.
    ``matmul=None`` reduce-scatters ``x`` itself.
    """
    what = "matmul_reduce_scatter"
    tp = group.size()
    shard = _shard_rows(x.shape[0], tp, what=what)
    spans = _offsets(validate_blocks(blocks, shard, what=what))
    by_rank = x.unflatten(0, (tp, shard))
    lane = CommLane(x.device)
    pending: list[Pending] = []
    for start, rows in spans:
        part = by_rank[:, start : start + rows].reshape(tp * rows, *x.shape[1:])
        partial = (matmul(part) if matmul is not None else part).contiguous()
        if out is None:
            out = partial.new_empty((shard, *partial.shape[1:]))
        elif start == 0:
            _check_out(out, (shard, *partial.shape[1:]), what=what)
        target = out[start : start + rows]
        pending.append(
            lane.launch(bind(reducer.reduce_scatter, partial, target, group), partial, target)
        )
    assert out is not None  # blocks are never empty
    return InFlight(out, lane, pending)


def _launch_block_gather(
    lane: CommLane,
    group: dist.ProcessGroup,
    x: torch.Tensor,
    start: int,
    rows: int,
    into: torch.Tensor | None,
) -> tuple[torch.Tensor, Pending]:
    """Launch the gather of rows ``start:start+rows`` of every rank into ``[tp*rows, ...]``."""
    part = x[start : start + rows].contiguous()
    buf = into if into is not None else part.new_empty((group.size() * rows, *x.shape[1:]))
    return buf, lane.launch(bind(launch_all_gather, buf, part, group), part, buf)


def all_gather_matmul(
    x: torch.Tensor,
    matmul: Matmul,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    *,
    out: torch.Tensor | None = None,
    keep_gathered: bool = False,
    gathered_out: torch.Tensor | None = None,
) -> GatherMatmulResult:
    """``matmul(all_gather(x))`` pipelined communicate-first.

    ``blocks`` split this rank's rows ``x`` (the shard).  Output rows are
    rank-major, exactly as after one serial all-gather along dim 0.  With
    ``keep_gathered`` (or a ``gathered_out`` given) the gathered ``x`` is
    returned too (for the weight gradient or ``all_gather_matmul_v2``).
    All collectives have completed when this returns.
    """
    what = "all_gather_matmul"
    tp = group.size()
    shard = x.shape[0]
    spans = _offsets(validate_blocks(blocks, shard, what=what))
    if gathered_out is not None:
        _check_out(gathered_out, (tp * shard, *x.shape[1:]), what=what)
    elif keep_gathered:
        gathered_out = x.new_empty((tp * shard, *x.shape[1:]))
    single = len(spans) == 1
    lane = CommLane(x.device)

    def launch(i: int) -> tuple[torch.Tensor, Pending]:
        start, rows = spans[i]
        return _launch_block_gather(lane, group, x, start, rows, gathered_out if single else None)

    in_flight = launch(0)
    for i, (start, rows) in enumerate(spans):
        buf, handle = in_flight
        if i + 1 < len(spans):
            in_flight = launch(i + 1)
        lane.wait(handle)
        y = matmul(buf)
        if out is None and single:
            out = y.contiguous()  # one block: the matmul output already is the serial layout
            break
        if out is None:
            out = y.new_empty((tp * shard, *y.shape[1:]))
        elif i == 0:
            _check_out(out, (tp * shard, *y.shape[1:]), what=what)
        out.unflatten(0, (tp, shard))[:, start : start + rows] = y.unflatten(0, (tp, rows))
        if gathered_out is not None and not single:
            gathered_out.unflatten(0, (tp, shard))[:, start : start + rows] = buf.unflatten(
                0, (tp, rows)
            )
    assert out is not None  # blocks are never empty
    return GatherMatmulResult(out, gathered_out)


def all_gather(
    x: torch.Tensor,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    *,
    out: torch.Tensor | None = None,
) -> InFlight[torch.Tensor]:
    """All-gather ``x`` along dim 0 in ``blocks`` of its rows, all launched now.

    The rows land rank-major (serial layout) once :meth:`InFlight.wait`
    returns; a single block gathers straight into ``out``.
    """
    what = "all_gather"
    tp = group.size()
    shard = x.shape[0]
    spans = _offsets(validate_blocks(blocks, shard, what=what))
    if out is None:
        out = x.new_empty((tp * shard, *x.shape[1:]))
    _check_out(out, (tp * shard, *x.shape[1:]), what=what)
    lane = CommLane(x.device)
    single = len(spans) == 1
    launched = [
        _launch_block_gather(lane, group, x, start, rows, out if single else None)
        for start, rows in spans
    ]

    def scatter_blocks_into_out() -> None:
        if single:
            return
        by_rank = out.unflatten(0, (tp, shard))
        for (start, rows), (buf, _) in zip(spans, launched, strict=True):
            by_rank[:, start : start + rows] = buf.unflatten(0, (tp, rows))

    return InFlight(out, lane, [h for _, h in launched], scatter_blocks_into_out)

