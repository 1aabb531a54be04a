"""How the overlap engine sums partial results over the TP group, and its asynchronous collective launches."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

from coc_impl.comm_lane import Pending

__all__ = ["SUM_REDUCER", "CollectiveReducer", "Reducer", "launch_all_gather", "launch_reduce_scatter"]


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
