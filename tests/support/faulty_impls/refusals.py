"""Faults beside refusals, errors, hangs and crashes: a failure before a refusal, a crash of the implementation's own
code, an error on one rank, a collective one rank never joins, a rank's process killed."""

from __future__ import annotations

from typing import Any

from coc_impl.config import CoCConfig
from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _EveryOp, _NoGather


class OpUnevenTypeError(ReferenceCoC):
    """matmul_all_reduce on an odd token count: a collective, then a TypeError of its own bug -- no refusal."""

    name = "fault-op-uneven-type-error"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch
        import torch.distributed as dist

        if x.shape[0] % 2 == 0:
            return super().matmul_all_reduce(x, w, bias, **kw)
        dist.all_reduce(torch.zeros(1), group=kw["group"])
        offset: Any = None
        return x[: x.shape[0] + offset]  # TypeError: unsupported operand type(s)


class DeadlocksEverywhere(_EveryOp):
    """Every op and patched layer waits in a collective that rank 0 never joins."""

    name = "fault-deadlocks"

    def _stall(self) -> None:
        import torch
        import torch.distributed as dist

        if dist.get_rank() != 0:
            dist.all_reduce(torch.ones(1))

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        self._stall()
        return super().through(op, x, w, bias, kw)

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def stalled() -> Any:
            self._stall()
            with ReferenceCoC.patch_megatron(self, config):
                yield

        return stalled()


class CrashesEverywhere(DeadlocksEverywhere):
    """Every op and patched layer kills rank 1's process."""

    name = "fault-crashes"

    def _stall(self) -> None:
        import os

        import torch.distributed as dist

        if dist.get_rank() == 1:
            os._exit(9)


class RaisesOnOneRankAfterReducing(ReferenceCoC):
    """matmul_all_reduce: rank 1 raises once its all-reduce is done (e.g. releasing a workspace); rank 0 returns."""

    name = "fault-raises-on-one-rank"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        out = super().matmul_all_reduce(x, w, bias, **kw)
        if dist.get_rank(kw["group"]) == 1:
            raise RuntimeError("workspace release failed")
        return out


class OneRowWrongOddRowsNotImplemented(ReferenceCoC):
    """matmul_all_reduce: one row comes back doubled, and every other odd token count raises NotImplementedError:
    a failure, then refusals of the same case's later sub-cases (the failure must stand)."""

    name = "fault-one-row-wrong-odd-rows-not-implemented"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if x.shape[0] == 1:
            return super().matmul_all_reduce(x, w, bias, **kw) * 2
        if x.shape[0] % 2:
            raise NotImplementedError("odd token counts are not implemented")
        return super().matmul_all_reduce(x, w, bias, **kw)


class NoGatherZeroScatter(_NoGather):
    """Offers no all-gather op, and its reduce-scatter returns zeros: in a sequence after a gather the zeros must
    still be judged (the gather is not offered; the scatter's numbers are wrong)."""

    name = "fault-no-gather-zero-scatter"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        result = super().through(op, x, w, bias, kw)
        return result.zero_() if op == "matmul_reduce_scatter" else result


class WrongDefaultTilingRefusesBlocks(_EveryOp):
    """Every op: under its own tiling its rows come back one row off (rolled by one); an explicit tiling
    (``blocks=``) raises ``NotImplementedError``.  The cases that call both ended "not offered": skipped."""

    name = "fault-wrong-default-tiling-refuses-blocks"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch

        if kw.get("blocks") is not None:
            raise NotImplementedError("explicit tilings (blocks=) are not implemented")
        result = super().through(op, x, w, bias, kw)
        if isinstance(result, tuple):
            return (torch.roll(result[0], 1, 0), result[1])
        return torch.roll(result, 1, 0)
