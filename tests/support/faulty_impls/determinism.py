"""Faults and a variant of ``deterministic=True``: sums in arrival order, a plan fixed per process, replicas rounded
apart, split invariance claimed but not held."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coc_impl.reference import ReferenceCoC


class _ReorderedDeterministicSum(ReferenceCoC):
    """``deterministic=True`` on ``matmul_all_reduce``: the ranks' float32 partials gathered and summed in the order
    :meth:`ordered` gives (the reference sums them in rank order)."""

    def ordered(self, parts: list[Any], group: Any) -> list[Any]:
        raise NotImplementedError

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if not kw.pop("deterministic", False):
            return super().matmul_all_reduce(x, w, bias, **kw)
        import torch
        import torch.distributed as dist

        kw.pop("blocks", None)
        group = kw["group"]
        tp = dist.get_world_size(group)
        wk = w.T if kw.get("transpose_weight") else w
        partial = x.float() @ wk.float()
        gathered = torch.empty((tp * partial.shape[0], partial.shape[1]))
        dist.all_gather_into_tensor(gathered, partial, group=group)
        parts = self.ordered(list(gathered.view(tp, *partial.shape)), group)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return (total if bias is None else total + bias.float()).to(x.dtype)


class ArrivalOrderReduction(_ReorderedDeterministicSum):
    """Claims ``deterministic=True`` but sums the ranks' partials in the order they arrive."""

    name = "fault-arrival-order"

    def ordered(self, parts: list[Any], group: Any) -> list[Any]:
        import random

        random.shuffle(parts)  # whichever rank's block "arrived" first
        return parts


class ReplicasRoundDifferently(ReferenceCoC):
    """matmul_all_reduce: odd ranks round their copy of the result one unit in the last place up.

    Every copy is within the error bound (MUST holds); the copies are not
    bitwise identical (SHOULD fails).
    """

    name = "fault-replicas-round-differently"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch
        import torch.distributed as dist

        out = super().matmul_all_reduce(x, w, bias, **kw)
        if kw.get("deterministic") or dist.get_rank(kw["group"]) % 2 == 0:
            return out
        return torch.nextafter(out, torch.full_like(out, float("inf")))


def row_count_gemm(x32: Any, w32: Any) -> Any:
    """A float32 GEMM that rounds a row by the rows it is given, as a device BLAS choosing split-K by shape does:
    the ``k`` sum is cut into ``1 + rows % 3`` slices, each multiplied, then added.  Deterministic for one shape;
    within the error bound for any."""
    rows, k = x32.shape
    cuts = [k * i // (1 + rows % 3) for i in range(2 + rows % 3)]
    total = x32[:, :cuts[1]] @ w32[:cuts[1]]
    for lo, hi in zip(cuts[1:], cuts[2:]):
        total = total + x32[:, lo:hi] @ w32[lo:hi]
    return total


def _deterministic_by_tiles(x: Any, w: Any, bias: Any, *, group: Any, scatter: bool, transpose_weight: bool = False,
                            blocks: Sequence[int] | None = None, **_: Any) -> Any:
    """Float32 partials of each tile (``blocks`` of the rows a rank keeps; one tile by default) by
    :func:`row_count_gemm`, all-gathered and summed in rank order, the bias once, one cast."""
    import torch
    import torch.distributed as dist

    tp, rank, m = dist.get_world_size(group), dist.get_rank(group), x.shape[0]
    if scatter and m % tp:
        raise ValueError(f"m={m} rows cannot be reduce-scattered over tp={tp} ranks")
    kept = m // tp if scatter else m
    tiles = list(blocks or (kept,))
    if sum(tiles) != kept or min(tiles) < 1:
        raise ValueError(f"blocks {tiles} do not tile the {kept} rows a rank keeps")
    w32 = (w.T if transpose_weight else w).float()
    partial = torch.empty((m, w32.shape[1]), dtype=torch.float32, device=x.device)
    start = 0
    for _chunk in range(tp if scatter else 1):
        for size in tiles:
            partial[start:start + size] = row_count_gemm(x[start:start + size].float(), w32)
            start += size
    parts = torch.empty((tp * m, w32.shape[1]), dtype=torch.float32, device=x.device)
    dist.all_gather_into_tensor(parts, partial, group=group)
    total = parts[:m].clone()
    for r in range(1, tp):
        total += parts[r * m:(r + 1) * m]
    if scatter:
        total = total[rank * kept:(rank + 1) * kept]
    return (total if bias is None else total + bias.float()).to(x.dtype).clone()


class RowCountRounding(ReferenceCoC):
    """Correct, with a deterministic mode whose GEMM rounds a row by the rows of its tile (a GPU's cuBLAS, emulated):
    the same tiling gives the same bits run after run, another tiling other bits within the error bound.  It
    declares no split invariance, so it conforms."""

    name = "variant-row-count-rounding"
    split_invariant_ops: Any = ()

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if not kw.pop("deterministic", False):
            return super().matmul_all_reduce(x, w, bias, **kw)
        return _deterministic_by_tiles(x, w, bias, scatter=False, **kw)

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if not kw.pop("deterministic", False):
            return super().matmul_reduce_scatter(x, w, bias, **kw)
        return _deterministic_by_tiles(x, w, bias, scatter=True, **kw)


class ClaimsSplitInvariance(RowCountRounding):
    """The same, declaring split invariance it does not have (the reference's claim, on a GPU whose GEMM rounds by
    the row count): another tiling gives other bits."""

    name = "fault-claims-split-invariance"
    split_invariant_ops = ("matmul_all_reduce", "matmul_reduce_scatter")


def _next_plan(group: Any) -> int:
    """The plan of a process's first deterministic call: a number rank 0 of ``group`` draws from a counter every
    set of ranks of the session (one fork server) shares, broadcast to the group -- a stand-in for the timings an
    autotuner measures, which differ from process to process."""
    import fcntl
    import os
    import tempfile
    from pathlib import Path

    import torch
    import torch.distributed as dist

    plan = torch.zeros(1, dtype=torch.int64)
    if dist.get_rank(group) == 0:
        path = Path(tempfile.gettempdir()) / f"coc-fault-plans-{os.getppid()}"
        with open(path, "a+") as counter:
            fcntl.flock(counter, fcntl.LOCK_EX)
            counter.seek(0)
            plan[0] = int(counter.read() or 0) + 1
            counter.seek(0)
            counter.truncate()
            counter.write(str(int(plan[0])))
    dist.broadcast(plan, group=group, group_src=0)
    return int(plan[0])


class PlanFixedPerProcess(_ReorderedDeterministicSum):
    """``deterministic=True`` sums the ranks' partials in an order fixed at the first deterministic call of the
    process and kept, as an autotuner that times once and caches its plan: the same bits run after run in one
    process, other bits on fresh ranks (each new set of ranks takes the next rotation of the ranks)."""

    name = "fault-plan-fixed-per-process"
    plans: dict[tuple[int, ...], int] = {}  #: per process: the group's ranks -> its rotation

    def ordered(self, parts: list[Any], group: Any) -> list[Any]:
        import torch.distributed as dist

        key = tuple(dist.get_process_group_ranks(group))
        if key not in self.plans:
            self.plans[key] = _next_plan(group) % len(parts)
        rotation = self.plans[key]
        return parts[rotation:] + parts[:rotation]
