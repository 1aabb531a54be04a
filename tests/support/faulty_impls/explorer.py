"""Faults only the explorer finds (``--coc-explore``): corners the fixed suite does not reach, and refusals the
refusal rule does not allow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _ConfigureWith, _EveryOp, _PatchedRowForward, _RecycledOutput


class _WrongInACorner(_EveryOp):
    """Every fused op but V2 returns its result with the last element wrong when :meth:`corner` holds."""

    def corner(self, op: str, result: Any, x: Any, bias: Any, kw: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        result = super().through(op, x, w, bias, kw)
        if op == "all_gather_matmul_v2" or not self.corner(op, result, x, bias, kw):
            return result
        wrong = result.clone()
        wrong[-1, -1] = float("nan")  # the last element of the tail tile left unwritten
        return wrong


class LongOddRowsTail(_WrongInACorner):
    """A result of more than 1000 rows, an odd number of them: the last row's tail is off (a large-m kernel path)."""

    name = "fault-long-odd-rows"

    def corner(self, op: str, result: Any, x: Any, bias: Any, kw: Mapping[str, Any]) -> bool:
        return bool(result.shape[0] > 1000 and result.shape[0] % 2)


class UnalignedKBias(_WrongInACorner):
    """With a bias and a rank's ``k`` no multiple of 4, the tail path adds the bias wrongly (vector loads of 4)."""

    name = "fault-unaligned-k-bias"

    def corner(self, op: str, result: Any, x: Any, bias: Any, kw: Mapping[str, Any]) -> bool:
        return bias is not None and x.shape[-1] % 4 != 0


class ThirdCallOfAShape(_WrongInACorner):
    """Double-buffered workspace: a call of one op and shape while the results of two earlier calls of that shape
    are still held (two slots in use) returns a stale slot's last element."""

    name = "fault-third-call-of-a-shape"

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[tuple[str, tuple[int, ...]], list[Any]] = {}  # (op, shape) -> weak refs to its results

    def corner(self, op: str, result: Any, x: Any, bias: Any, kw: Mapping[str, Any]) -> bool:
        import weakref

        if "blocks" in kw or kw.get("deterministic"):
            return False
        key = (op, tuple(x.shape))
        alive = [ref for ref in self._held.get(key, []) if ref() is not None]
        self._held[key] = [*alive, weakref.ref(result)]
        return len(alive) >= 2


class WrongAtTp3(_WrongInACorner):
    """Wrong on a TP group of 3 ranks (a size no power of two; the suite's TP sizes are 2, 4 and 8)."""

    name = "fault-wrong-at-tp3"

    def corner(self, op: str, result: Any, x: Any, bias: Any, kw: Mapping[str, Any]) -> bool:
        import torch.distributed as dist

        return bool(dist.get_world_size(kw["group"]) == 3)


class SlicedOddKReadsContiguous(_WrongInACorner):
    """An ``x`` that is a column slice of a wider buffer, with an odd ``k``: the unaligned path reads the storage as
    if it were contiguous (the fixed strided corner has an even ``k``)."""

    name = "fault-sliced-odd-k"

    def corner(self, op: str, result: Any, x: Any, bias: Any, kw: Mapping[str, Any]) -> bool:
        return bool(not x.is_contiguous() and x.shape[-1] % 2)


class ScatterOutputReusedByAllReduce(_RecycledOutput):
    """The reduce-scatter's output stays in the pool the all-reduce stages its partials in: an all-reduce after a
    reduce-scatter overwrites the scatter's result (the fixed sequences run other orders)."""

    name = "fault-scatter-output-reused-by-all-reduce"

    def kept(self, op: str) -> bool:
        return op == "matmul_reduce_scatter"

    def stages(self, op: str) -> bool:
        return op == "matmul_all_reduce"


class ClampsChunkCountBelowOne(ReferenceCoC):
    """``--coc-parallel-num`` 0 or negative is clamped to 1 (CoC on, unchunked) instead of refused: a setting the
    user typed is silently replaced (the fixed tables try 3, 16 and words, never a count below one)."""

    name = "fault-clamps-chunk-count"

    def configure(self, argv: Any, env: Any, **kwargs: Any) -> Any:
        argv = list(argv or [])
        for i, arg in enumerate(argv[:-1]):
            if arg == "--coc-parallel-num" and argv[i + 1].lstrip("-").isdigit() and int(argv[i + 1]) < 1:
                argv[i + 1] = "1"
        return super().configure(argv, env, **kwargs)


class ClampsChunkCountConfigureOnly:
    """:class:`ClampsChunkCountBelowOne` offering ``configure`` alone (no op, no layer): an exploration of it draws
    configurations only, so the draws of a seed find it, however slow the machine."""

    name = "fault-clamps-chunk-count-configure-only"
    protocol_version = ClampsChunkCountBelowOne.protocol_version
    error_types = ClampsChunkCountBelowOne.error_types

    def __init__(self) -> None:
        self._fault = ClampsChunkCountBelowOne()

    def configure(self, argv: Any, env: Any, **kwargs: Any) -> Any:
        return self._fault.configure(argv, env, **kwargs)


class RowOutputSizedByFirstCall(_PatchedRowForward):
    """The row layer's output workspace is sized by its first call: the rows of a later, longer micro-batch beyond
    that size stay zero (the fixed training runs its longer micro-batch first)."""

    name = "fault-row-output-sized-by-first-call"

    def wrap(self, original: Any) -> Any:
        sized: dict[str, int] = {}

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            out = original(x, weight, bias, **kw)
            rows = sized.setdefault("rows", out.shape[0])
            if out.shape[0] > rows:
                out = out.clone()
                out[rows:] = 0
            return out

        return row_forward


class ScaleCacheOfFourGroups(ReferenceCoC):
    """Per-group w8A16 keeps four groups' scales and offsets on chip: a rank's fifth group on reuses the fourth's
    (the fixed cases have at most four groups per rank)."""

    name = "fault-scale-cache-of-four-groups"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if kw.get("antiquant_group_size"):
            for name in ("antiquant_scale", "antiquant_offset"):
                rows = kw.get(name)
                if rows is not None and rows.shape[0] > 4:
                    kw[name] = rows.clone()
                    kw[name][4:] = rows[3]
        return super().matmul_all_reduce(x, w, bias, **kw)


class _RefusesCalls(_EveryOp):
    """Refuses the calls ``refuses`` picks, on every rank, before any collective, naming tp (a clear refusal in
    form, of calls no refusal rule lets it refuse)."""

    def refuses(self, op: str, x: Any, tp: int) -> bool:
        raise NotImplementedError

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch.distributed as dist

        tp = dist.get_world_size(kw["group"])
        if self.refuses(op, x, tp):
            raise ValueError(f"this build supports no {op} call of {x.shape[0]} rows at tp={tp}")
        return super().through(op, x, w, bias, kw)


class RefusesEveryCall(_RefusesCalls):
    """Refuses every call of every op ("this build supports no calls at tp=N"): nothing ever runs."""

    name = "fault-refuses-every-call"

    def refuses(self, op: str, x: Any, tp: int) -> bool:
        return True


class RefusesLargeGathers(_RefusesCalls):
    """Refuses the all-gather ops once they gather 1024 rows or more: ordinary large gathers."""

    name = "fault-refuses-large-gathers"

    def refuses(self, op: str, x: Any, tp: int) -> bool:
        return op.startswith("all_gather") and x.shape[0] * tp >= 1024


class AcceptsTpZeroAndMc2(_ConfigureWith):
    """Accepts both a TP size of 0 (as 1) and CoC with MC2: two configuration defects, one finding each."""

    name = "fault-accepts-tp-zero-and-mc2"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        return {"use_ascend_mc2": False, "tp_size": kw.get("tp_size") or 1}
