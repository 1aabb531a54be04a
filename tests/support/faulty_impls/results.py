"""Faults of what an op hands back: results that are not results (None, a list, a wrong shape, dtype or device),
results that change after they are handed out (reused buffers, a mutated input), resources left behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _EveryOp, _EveryOpOutput, _RecycledOutput


class CachedOutputBuffer(_EveryOp):
    """Returns one persistent output buffer per op, overwritten by the next call (a fused-kernel workspace); V2's
    pair is its own."""

    name = "fault-cached-output"

    def __init__(self) -> None:
        super().__init__()
        self._buffers: dict[str, Any] = {}

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch

        result = super().through(op, x, w, bias, kw)
        if op == "all_gather_matmul_v2":
            return result
        buffer = self._buffers.get(op)
        if buffer is None or buffer.numel() < result.numel() or buffer.dtype != result.dtype:
            buffer = self._buffers[op] = torch.empty(result.numel() * 4, dtype=result.dtype)
        view = buffer[: result.numel()].view(result.shape)
        view.copy_(result)
        return view


class MutatesInput(ReferenceCoC):
    """matmul_all_reduce zeroes the first row of its input after using it."""

    name = "fault-mutates-input"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        out = super().matmul_all_reduce(x, w, bias, **kw)
        x[0].zero_()
        return out


class _ResultFault(ReferenceCoC):
    """matmul_all_reduce returns ``self.bad(result)`` instead of its result."""

    bad: Callable[[Any], Any]

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.bad(super().matmul_all_reduce(x, w, bias, **kw))


class ReturnsNone(_ResultFault):
    name = "fault-returns-none"
    bad = staticmethod(lambda result: None)


class ReturnsList(_ResultFault):
    name = "fault-returns-list"
    bad = staticmethod(lambda result: result.tolist())


class ReturnsWrongShape(_ResultFault):
    name = "fault-wrong-shape"
    bad = staticmethod(lambda result: result[:-1])


class ReturnsWrongShapeTwice(ReturnsWrongShape):
    """The same fault, and now all_gather_matmul too (a new fault on top of a known one)."""

    name = "fault-wrong-shape-twice"

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.bad(super().all_gather_matmul(x, w, bias, **kw))


class ReturnsWrongDtype(_ResultFault):
    name = "fault-wrong-dtype"
    bad = staticmethod(lambda result: result.double())


class ReturnsOnAnotherDevice(_ResultFault):
    name = "fault-wrong-device"
    bad = staticmethod(lambda result: result.to("meta"))


class LeaksProcessGroups(ReferenceCoC):
    """Creates a new process group on every call and never destroys it."""

    name = "fault-leaks-groups"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        ranks = dist.get_process_group_ranks(kw["group"])
        kw["group"] = dist.new_group(ranks)
        return super().matmul_all_reduce(x, w, bias, **kw)


def _alias(storage_of: Any, like: Any) -> Any:
    """A tensor shaped like ``like`` over the start of ``storage_of``'s memory (as a kernel's output would be)."""
    import torch

    return torch.empty(0, dtype=like.dtype).set_(storage_of.untyped_storage(), 0, like.shape).copy_(like)


class DoubleBufferedWorkspace(_EveryOpOutput):
    """Outputs live in two workspaces per shape, used in turn: the third call of a shape overwrites the first's."""

    name = "fault-double-buffered"

    def __init__(self) -> None:
        super().__init__()
        self._buffers: dict[tuple[Any, ...], list[Any]] = {}
        self._turn: dict[tuple[Any, ...], int] = {}

    def bad(self, output: Any) -> Any:
        import torch
        import torch.distributed as dist

        key = (dist.get_rank(), tuple(output.shape), output.dtype)  # per rank: threaded ranks share the instance
        pair = self._buffers.setdefault(key, [torch.empty(output.shape, dtype=output.dtype) for _ in range(2)])
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return _alias(pair[turn % 2], output)


class SharedWorkspaceBetweenOps(_RecycledOutput):
    """The gathers' output buffer is recycled as the reduce ops' scratch: a reduce after a gather overwrites it."""

    name = "fault-shared-workspace-between-ops"

    def kept(self, op: str) -> bool:
        return op.startswith("all_gather")

    def stages(self, op: str) -> bool:
        return not op.startswith("all_gather")


class ScatterPiecesOfTwoShapes(ReferenceCoC):
    """matmul_reduce_scatter drops its last column on every rank but 0: the ranks' pieces are no shards of one
    tensor (issue 50: assembling them raised, a suite error that dropped the failures recorded before it)."""

    name = "fault-scatter-pieces-of-two-shapes"

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        out = super().matmul_reduce_scatter(x, w, bias, **kw)
        return out if dist.get_rank(kw.get("group")) == 0 else out[:, :-1].contiguous()
