"""Collectives through names bound at the implementation's import, and work returned before it is waited for."""

from __future__ import annotations

from typing import Any

from coc_impl.config import CoCConfig
from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _EveryOp, _waited_at_once


class _ReturnsBeforeWaiting(ReferenceCoC):
    """matmul_all_reduce launches its all-reduce asynchronously through :meth:`collectives` and returns without
    waiting for it."""

    def collectives(self) -> Any:
        raise NotImplementedError

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if kw.get("deterministic") or kw.get("antiquant_scale") is not None:
            return super().matmul_all_reduce(x, w, bias, **kw)
        out = x @ (w.t() if kw.get("transpose_weight") else w)
        self.collectives().all_reduce(out, group=kw["group"], async_op=True)  # never waited
        return out if bias is None else out.add_(bias)


class ReturnsBeforeWaiting(_ReturnsBeforeWaiting):
    """matmul_all_reduce launches its all-reduce asynchronously and returns without waiting for it."""

    name = "fault-returns-before-waiting"

    def collectives(self) -> Any:
        import torch.distributed as dist

        return dist


def _import_time_dist() -> Any:
    """What ``from torch.distributed import *`` binds in a package's own module: the functions as they are now.

    Any probe wrapper installed before this module's import is peeled off, so
    the names are the ones a package imported before any recording would hold.
    """
    import types

    import torch.distributed as dist

    def unwrapped(value: Any) -> Any:
        while getattr(value, "_coc_probe", False):
            value = value.__wrapped__
        return value

    names = [n for n in dir(dist) if not n.startswith("__")]
    return types.SimpleNamespace(**{n: unwrapped(getattr(dist, n)) for n in names})


#: The package's alias module (``mydist.all_reduce(..., async_op=True)``), bound once at import.
MYDIST = _import_time_dist()


class AliasBoundCollectives(_EveryOp):
    """Correct: the reference, issuing and waiting for every collective through names bound at its import."""

    name = "variant-alias-bound-collectives"

    def _aliased(self) -> Any:
        from contextlib import ExitStack
        from unittest import mock

        import coc_impl.deterministic
        import coc_impl.reducers

        stack = ExitStack()
        for module in (coc_impl.reducers, coc_impl.deterministic):
            stack.enter_context(mock.patch.object(module, "dist", MYDIST))
        return stack

    def patch_megatron(self, config: CoCConfig) -> Any:
        stack = self._aliased()
        stack.enter_context(super().patch_megatron(config))
        return stack

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        with self._aliased():
            return super().through(op, x, w, bias, kw)


class AliasReturnsBeforeWaiting(_ReturnsBeforeWaiting):
    """matmul_all_reduce launches its all-reduce through the import-time alias and returns without waiting."""

    name = "fault-alias-returns-before-waiting"

    def collectives(self) -> Any:
        return MYDIST


class AliasAsyncButBlocking(AliasBoundCollectives):
    """Through the import-time alias, each all-reduce chunk is launched async and waited for at once (serial)."""

    name = "fault-alias-async-but-blocking"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from unittest import mock

        import coc_impl.reducers as reducers

        def all_reduce(partial: Any, out: Any, group: Any) -> Any:
            return _waited_at_once(lambda t: MYDIST.all_reduce(t, group=group, async_op=True), partial, out)

        stack = super().patch_megatron(config)
        stack.enter_context(mock.patch.object(reducers.SUM_REDUCER, "all_reduce", all_reduce))
        return stack
