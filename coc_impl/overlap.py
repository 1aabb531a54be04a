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

A plain :data:`Matmul` returns each block's product as a fresh tensor, which
the engine then copies into the result.  A :class:`Product` can also write a
block straight into its rows of the result; the all-reduce pipeline uses that
(one allocation, no copy) and sums the rows in place, like the serial
``all_reduce(x @ w)``.

Collectives are asynchronous (``async_op=True`` work handles).  On CUDA / NPU
they are launched on a dedicated communication stream, ordered against the
compute stream with events; on CPU they run inline (gloo has its own threads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial as bind
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F

from coc_impl.errors import CoCShapeError

T = TypeVar("T")

#: One block of rows ``[b, k]`` -> its outputs ``[b, n]``.  The caller owns
#: transposition, padding and dequantisation; the engine only slices rows.
Matmul = Callable[[torch.Tensor], torch.Tensor]


def gemm_dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where a GEMM reads it as one dense block (row- or column-major), else a contiguous copy.

    A column slice of a wider buffer (row stride above the row length) is copied:
    torch's CPU bfloat16 GEMM reads past the end of each such row (torch 2.13:
    NaN padding beside a ``[257, 3]`` slice comes back as NaN rows).
    """
    if t.dim() != 2 or t.is_contiguous() or t.t().is_contiguous():
        return t
    return t.contiguous()


@dataclass(frozen=True)
class Product:
    """``rows @ right`` for the engine, optionally straight into the result's rows.

    ``pad_k`` zero columns are appended to every block of rows (``right``
    already holds the matching zero rows: the soc-friendly re-lay), and a
    block thinner than ``min_rows`` is zero-padded to that many rows, so that
    thin tiles run the same BLAS kernel as the rows of a large matmul.
    """

    right: torch.Tensor  #: ``[k + pad_k, n]``
    pad_k: int = 0
    min_rows: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "right", gemm_dense(self.right))

    def _lhs(self, rows: torch.Tensor) -> torch.Tensor:
        lhs = F.pad(rows, (0, self.pad_k)) if self.pad_k else gemm_dense(rows)
        short = self.min_rows - lhs.shape[0]
        return F.pad(lhs, (0, 0, 0, short)) if short > 0 else lhs

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """The product of ``rows`` as a fresh tensor (a :data:`Matmul`)."""
        return torch.matmul(self._lhs(rows), self.right)[: rows.shape[0]]

    def empty(self, rows: torch.Tensor) -> torch.Tensor:
        """An uninitialised result for all of ``rows``."""
        return rows.new_empty((rows.shape[0], self.right.shape[1]), dtype=self.right.dtype)

    def into(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the product of ``rows`` into ``out`` (contiguous ``[rows, n]``) and return it."""
        if rows.shape[0] < self.min_rows:
            return out.copy_(self(rows))
        return torch.matmul(self._lhs(rows), self.right, out=out)


class Pending(Protocol):
    """A launched collective (a ``dist.Work`` or a reducer's own handle)."""

    def wait(self) -> Any: ...


class Reducer(Protocol):
    """How partial results are summed over the TP group.

    Both methods *launch* the reduction and return a handle; after
    ``handle.wait()`` the result must be complete in ``out``.  ``partial`` is
    contiguous and must not be modified before the wait; ``out`` is a
    contiguous view into the engine's result.

    * ``all_reduce``: ``out = sum over ranks of partial`` (same shape).
    * ``reduce_scatter``: ``partial`` has ``tp * out.shape[0]`` rows, rank-major;
      ``out = sum over ranks r' of partial_{r'}[rank rows]``.

    The default :data:`SUM_REDUCER` issues ``dist.all_reduce`` /
    ``dist.reduce_scatter`` directly.  A deterministic reducer (all-gather the
    partials, sum in ascending rank order in fp32, cast) does its summation in
    ``wait()``.
    """

    def all_reduce(
        self, partial: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup
    ) -> Pending: ...

    def reduce_scatter(
        self, partial: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup
    ) -> Pending: ...


def launch_all_gather(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup) -> Pending:
    """Async ``all_gather_into_tensor`` (renamed ``all_gather_single`` in newer torch).

    Looked up on ``dist`` at call time so a wrapped ``torch.distributed``
    (e.g. a test counting collectives) sees every call.
    """
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=True)


def launch_reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup) -> Pending:
    """Async ``reduce_scatter_tensor`` (renamed ``reduce_scatter_single`` in newer torch)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=True)


class CollectiveReducer:
    """Plain sum through the backend's own collectives (order is the backend's)."""

    def all_reduce(
        self, partial: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup
    ) -> Pending:
        if out.data_ptr() != partial.data_ptr():
            out.copy_(partial)
        return dist.all_reduce(out, group=group, async_op=True)

    def reduce_scatter(
        self, partial: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup
    ) -> Pending:
        return launch_reduce_scatter(out, partial, group)


SUM_REDUCER: Reducer = CollectiveReducer()

_COMM_STREAMS: dict[torch.device, Any] = {}


class _CommLane:
    """Where collectives run: a side stream on CUDA / NPU, inline on CPU."""

    def __init__(self, device: torch.device) -> None:
        self._module: Any = None  # torch.cuda / torch.npu
        self._stream: Any = None
        if device.type in ("cuda", "npu"):
            self._module = torch.get_device_module(device)
            if device not in _COMM_STREAMS:
                _COMM_STREAMS[device] = self._module.Stream(device=device)
            self._stream = _COMM_STREAMS[device]

    def launch(self, start: Callable[[], Pending], *tensors: torch.Tensor) -> Pending:
        """Start a collective after the compute work queued so far on ``tensors``."""
        if self._stream is None:
            return start()
        ready = self._module.Event()
        ready.record(self._module.current_stream())
        self._stream.wait_event(ready)
        with self._module.stream(self._stream):
            for t in tensors:
                t.record_stream(self._stream)  # keep the allocator from reusing it early
            return start()

    def wait(self, pending: Pending) -> None:
        """Block until ``pending`` finished and order later compute after it."""
        if self._stream is None:
            pending.wait()
            return
        with self._module.stream(self._stream):
            pending.wait()
        done = self._module.Event()
        done.record(self._stream)
        self._module.current_stream().wait_event(done)


@dataclass
class InFlight(Generic[T]):
    """A result whose collectives may still be running; :meth:`wait` finishes it."""

    result: T
    _lane: _CommLane
    _pending: list[Pending] = field(default_factory=list)
    _finish: Callable[[], None] | None = None
    _done: bool = False

    def wait(self) -> T:
        """Wait for every collective (in launch order) and return the result."""
        if not self._done:
            for pending in self._pending:
                self._lane.wait(pending)
            if self._finish is not None:
                self._finish()
            self._done = True
        return self.result


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
    lane = _CommLane(x.device)
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
    lane = _CommLane(x.device)
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
    lane: _CommLane,
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
    lane = _CommLane(x.device)

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
    lane = _CommLane(x.device)
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


def reduce_scatter(
    x: torch.Tensor,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    *,
    reducer: Reducer = SUM_REDUCER,
    out: torch.Tensor | None = None,
) -> InFlight[torch.Tensor]:
    """Pipelined reduce-scatter of ``x`` along dim 0 (no matmul)."""
    return matmul_reduce_scatter(x, None, blocks, group, reducer=reducer, out=out)


def all_reduce(
    x: torch.Tensor,
    blocks: Sequence[int],
    group: dist.ProcessGroup,
    *,
    reducer: Reducer = SUM_REDUCER,
    out: torch.Tensor | None = None,
) -> InFlight[torch.Tensor]:
    """Pipelined all-reduce of ``x`` (no matmul); ``out=x`` reduces in place."""
    return matmul_all_reduce(x, None, blocks, group, reducer=reducer, out=out)
