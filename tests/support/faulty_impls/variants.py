"""Correct variants: what the checks must pass (or skip)."""

from __future__ import annotations

from typing import Any

from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _EveryOp, _group_of_its_own, _NoGather


class NoDeterministicMode(_EveryOp):
    """Correct, but without ``deterministic=True``: it says so with NotImplementedError (cases skip)."""

    name = "variant-no-deterministic"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        if kw.get("deterministic"):
            raise NotImplementedError("deterministic reduction is not implemented")
        return super().through(op, x, w, bias, kw)


class OwnSubgroups(ReferenceCoC):
    """Correct: runs its collectives on a process group of its own spanning the same ranks as the TP group."""

    name = "variant-own-subgroups"

    def __init__(self) -> None:
        super().__init__()
        self._groups: dict[tuple[int, ...], Any] = {}

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        own = _group_of_its_own(self._groups, kw["group"])  # created once per group, on the first call: no leak
        return super().matmul_all_reduce(x, w, bias, **{**kw, "group": own})


class OddRowsNotImplemented(ReferenceCoC):
    """Correct, but matmul_all_reduce raises NotImplementedError for odd token counts (cases of them are not
    offered)."""

    name = "variant-odd-rows-not-implemented"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if x.shape[0] % 2:
            raise NotImplementedError("odd token counts are not implemented")
        return super().matmul_all_reduce(x, w, bias, **kw)


class OffersNoGather(_NoGather):
    """Correct, offering no all-gather op (``NotImplementedError``): a sequence with a gather judges its other op."""

    name = "variant-offers-no-gather"


class OffersNoOp(ReferenceCoC):
    """Correct, offering no fused op at all: every call raises ``NotImplementedError`` (nothing to judge)."""

    name = "variant-offers-no-op"

    def _absent(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError("no fused ops in this build")

    matmul_all_reduce = matmul_reduce_scatter = all_gather_matmul = all_gather_matmul_v2 = _absent
