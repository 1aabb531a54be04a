"""Faults of the fused ops' numbers: a wrong order, shard, group or layout, quantization arguments misread, rows or
columns left unwritten."""

from __future__ import annotations

from typing import Any

from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _EveryOp, _EveryOpOutput


class V2GatheredWrongOrder(ReferenceCoC):
    """all_gather_matmul_v2 returns the gathered input with rank blocks in reverse order."""

    name = "fault-v2-order"

    def all_gather_matmul_v2(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        out, gathered = super().all_gather_matmul_v2(x, w, bias, **kw)
        tp = dist.get_world_size(kw["group"])
        return out, gathered.view(tp, -1, gathered.shape[-1]).flip(0).reshape(gathered.shape)


class AntiquantOffsetIgnored(ReferenceCoC):
    """w8A16 drops ``antiquant_offset``."""

    name = "fault-offset-ignored"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        kw["antiquant_offset"] = None
        return super().matmul_all_reduce(x, w, bias, **kw)


class PerGroupAsPerChannel(ReferenceCoC):
    """Per-group scales applied per channel (the first group's row for every k)."""

    name = "fault-group-as-channel"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if kw.get("antiquant_group_size"):
            kw["antiquant_group_size"] = 0
            kw["antiquant_scale"] = kw["antiquant_scale"][0]
            if kw.get("antiquant_offset") is not None:
                kw["antiquant_offset"] = kw["antiquant_offset"][0]
        return super().matmul_all_reduce(x, w, bias, **kw)


class SquareWeightTransposed(_EveryOp):
    """Infers transposition from shapes: a square weight is taken as ``[n, k]`` (by the ops that see a whole one)."""

    name = "fault-square-transposed"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        if op in ("matmul_all_reduce", "all_gather_matmul") and w.shape[0] == w.shape[1]:
            kw = {**kw, "transpose_weight": True}
        return super().through(op, x, w, bias, kw)


class ReduceScatterNeighbourShard(ReferenceCoC):
    """matmul_reduce_scatter returns the next rank's shard."""

    name = "fault-neighbour-shard"

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch
        import torch.distributed as dist

        mine = super().matmul_reduce_scatter(x, w, bias, **kw)
        group = kw["group"]
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        every = torch.empty((tp * mine.shape[0], mine.shape[1]), dtype=mine.dtype)
        dist.all_gather_into_tensor(every, mine.contiguous(), group=group)
        return every.view(tp, *mine.shape)[(rank + 1) % tp].clone()


class OpUnevenGarbageRows(ReferenceCoC):
    """matmul_all_reduce computes an even number of rows; an odd last row is left as allocated."""

    name = "fault-op-uneven-garbage"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch

        if x.shape[0] % 2 == 0:
            return super().matmul_all_reduce(x, w, bias, **kw)
        n = w.shape[0] if kw.get("transpose_weight") else w.shape[1]
        out = torch.empty(x.shape[0], n, dtype=x.dtype)
        if x.shape[0] > 1:
            out[:-1] = super().matmul_all_reduce(x[:-1], w, bias, **kw)
        else:
            super().matmul_all_reduce(x, w, bias, **kw)  # the collective still runs on every rank
        return out


class WrongGroupOps(_EveryOp):
    """Every op runs its collectives on the default (world) group instead of the TP group it is given."""

    name = "fault-wrong-group-ops"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch.distributed as dist

        return super().through(op, x, w, bias, {**kw, "group": dist.group.WORLD})


class RaggedTilingOffset(ReferenceCoC):
    """matmul_reduce_scatter with a ragged explicit tiling puts the last block one row too early."""

    name = "fault-ragged-offset"

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        out = super().matmul_reduce_scatter(x, w, bias, **kw)
        blocks = kw.get("blocks")
        if blocks and len(set(blocks)) > 1 and blocks[-1] < out.shape[0]:
            last = blocks[-1]
            out[-last - 1:-1] = out[-last:].clone()
        return out


class UnwrittenColumnTail(_EveryOpOutput):
    """The epilogue writes the output in tiles of 16 columns: the last ``n % 16`` columns stay as allocated."""

    name = "fault-unwritten-column-tail"

    def bad(self, output: Any) -> Any:
        import torch

        covered = output.shape[-1] - output.shape[-1] % 16
        tiled = torch.empty_like(output)
        tiled[..., :covered] = output[..., :covered]
        return tiled


class LargeGatherDropsLastBlock(_EveryOpOutput):
    """Above 2048 output rows the op switches algorithm, and that path never writes its last block of 128 rows."""

    name = "fault-large-gather-drops-block"

    def bad(self, output: Any) -> Any:
        import torch

        if output.shape[0] <= 2048:
            return output
        switched = torch.empty_like(output)
        switched[:-128] = output[:-128]
        return switched


class RawPointerWeight(_EveryOp):
    """A raw-pointer kernel: reads ``w`` from the start of its storage as if contiguous (``w.contiguous()`` missing)."""

    name = "fault-raw-pointer-weight"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch

        as_if_contiguous = torch.empty(0, dtype=w.dtype).set_(w.untyped_storage(), 0, w.shape)
        return super().through(op, x, as_if_contiguous, bias, kw)


class Group128MisIndexed(ReferenceCoC):
    """w8A16 with group size 128: each k row takes the next group's scale and offset (an off-by-one group index)."""

    name = "fault-group128-misindexed"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if kw.get("antiquant_group_size") == 128:
            for name in ("antiquant_scale", "antiquant_offset"):
                if kw.get(name) is not None:
                    kw[name] = kw[name].roll(-1, 0)
        return super().matmul_all_reduce(x, w, bias, **kw)


class DropsScatterRemainder(ReferenceCoC):
    """matmul_reduce_scatter: ``m % tp`` leftover rows are silently dropped instead of refused."""

    name = "fault-drops-scatter-remainder"

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        extra = x.shape[0] % kw["group"].size()
        return super().matmul_reduce_scatter(x[: x.shape[0] - extra] if extra else x, w, bias, **kw)


class TruncatesLongScale(ReferenceCoC):
    """w8A16: a per-channel ``antiquant_scale`` longer than n is cut to n instead of refused."""

    name = "fault-truncates-long-scale"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        from coc_impl.quant import weight_kn

        scale = kw.get("antiquant_scale")
        if scale is not None and scale.dim() == 1 and not kw.get("antiquant_group_size"):
            kw["antiquant_scale"] = scale[: weight_kn(w, bool(kw.get("transpose_weight")))[1]]
        return super().matmul_all_reduce(x, w, bias, **kw)
