"""What faults of several families are built on: every fused op through one method, the overlap engine with one
function wrapped, a blocking wait or gather in place of an overlapped one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from typing import Any

from coc_impl.config import CoCConfig
from coc_impl.reference import ReferenceCoC


def _patched(then: Callable[[], Any], *patches: tuple[Any, str, Any]) -> ExitStack:
    """Each ``(owner, attribute, value)`` of ``patches`` set (undone on exit), then the context ``then()`` gives
    entered (called once they are set, as a patch reads them)."""
    from unittest import mock

    stack = ExitStack()
    for owner, attribute, value in patches:
        stack.enter_context(mock.patch.object(owner, attribute, value))
    stack.enter_context(then())
    return stack


def _with_user_cfgs(config: CoCConfig, **changes: Any) -> CoCConfig:
    """``config`` with ``changes`` made to its user settings (a setting an implementation ignores)."""
    from dataclasses import replace

    return replace(config, user_cfgs=replace(config.user_cfgs, **changes))


def _group_of_its_own(groups: dict[tuple[int, ...], Any], group: Any) -> Any:
    """A process group of the same ranks as ``group``, created on its first call and kept in ``groups``."""
    import torch.distributed as dist

    ranks = tuple(dist.get_process_group_ranks(group))
    if ranks not in groups:
        groups[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)
    return groups[ranks]


class _ConfigureWith(ReferenceCoC):
    """``configure`` with the keywords :meth:`forced` gives replaced (the reference does the rest)."""

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        return super().configure(argv, env, **{**kw, **self.forced(kw)})


class _EveryOp(ReferenceCoC):
    """Every fused op goes through :meth:`through` (where a fault goes wrong), which calls the reference's op."""

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        return getattr(ReferenceCoC, op)(self, x, w, bias, **kw)

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.through("matmul_all_reduce", x, w, bias, kw)

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.through("matmul_reduce_scatter", x, w, bias, kw)

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.through("all_gather_matmul", x, w, bias, kw)

    def all_gather_matmul_v2(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.through("all_gather_matmul_v2", x, w, bias, kw)


class _PatchedPipeline(ReferenceCoC):
    """Runs the reference patch with one overlap-engine function of ``coc_impl.scripted`` wrapped."""

    target: str = ""

    def wrap(self, original: Any) -> Any:
        raise NotImplementedError

    def patch_megatron(self, config: CoCConfig) -> Any:
        import coc_impl.scripted as scripted

        return _patched(partial(super().patch_megatron, config),
                        (scripted, self.target, self.wrap(getattr(scripted, self.target))))


class _PatchedRowForward(_PatchedPipeline):
    """Runs the reference patch with the backend's ``row_forward`` (the one the patch calls) wrapped."""

    target = "row_forward"

    def patch_megatron(self, config: CoCConfig) -> Any:
        import coc_impl.megatron_patch as patch

        # The patch calls the backend module's row_forward; wrap it there.
        backend = patch.backend_for(config)
        wrapped = () if backend is None else ((backend, "row_forward", self.wrap(backend.row_forward)),)
        return _patched(partial(ReferenceCoC.patch_megatron, self, config), *wrapped)


def _waited_at_once(launch: Any, partial: Any, out: Any) -> Any:
    """An all-reduce of ``partial`` into ``out``, launched asynchronously by ``launch(out)`` and waited for at once:
    nothing can overlap it."""
    if out.data_ptr() != partial.data_ptr():
        out.copy_(partial)
    work = launch(out)
    work.wait()
    return work


def _whole_blocking_gather(x: Any, matmul: Any, group: Any) -> Any:
    """The all-gather + matmul done serially: ``x`` gathered whole in one blocking all-gather, then multiplied."""
    import torch
    import torch.distributed as dist

    from coc_impl.overlap import GatherMatmulResult

    gathered = torch.empty((x.shape[0] * group.size(), *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)  # blocking, whole
    return GatherMatmulResult(matmul(gathered), gathered)


class _EveryOpOutput(_EveryOp):
    """Every op's output (the first of V2's pair) is replaced by ``self.bad(output)``."""

    def bad(self, output: Any) -> Any:
        raise NotImplementedError

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        result = super().through(op, x, w, bias, kw)
        return (self.bad(result[0]), result[1]) if isinstance(result, tuple) else self.bad(result)


class _RecycledOutput(_EveryOp):
    """The output of an op :meth:`kept` picks stays in a pool (per rank: threaded ranks share the instance) that a
    later op :meth:`stages` picks writes its partials into: a result handed out, and yet overwritten."""

    def __init__(self) -> None:
        super().__init__()
        self._pool: dict[int, Any] = {}

    def kept(self, op: str) -> bool:
        raise NotImplementedError

    def stages(self, op: str) -> bool:
        raise NotImplementedError

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch.distributed as dist

        result = super().through(op, x, w, bias, kw)
        output, rank = (result[0] if isinstance(result, tuple) else result), dist.get_rank()
        if self.kept(op):
            self._pool[rank] = output  # handed out, and yet kept in the pool
        elif self.stages(op) and rank in self._pool:
            staged, count = self._pool[rank], min(self._pool[rank].numel(), output.numel())
            staged.view(-1)[:count].copy_(output.reshape(-1)[:count] * 2)  # partials staged there
        return result


class _NoGather(_EveryOp):
    """Offers no all-gather op: both raise ``NotImplementedError`` on every rank."""

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        if op.startswith("all_gather"):
            raise NotImplementedError("no all-gather ops in this build")
        return super().through(op, x, w, bias, kw)
