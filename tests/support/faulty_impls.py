"""Deliberately broken implementations: proof that the conformance checks bite.

Each is a small subclass of the reference with one defect (a bug class seen in
real CoC code, or one that escaped other projects' tests); the proof table in
``tests/suite_runs/test_suite_bites.py`` runs the suite against each and expects the
named checks to fail.  The correct variants that must still pass (or skip)
are at the end.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from coc_impl.config import CoCConfig, resolve_config
from coc_impl.reference import ReferenceCoC, ReferenceCoCAuto
from conformance.protocol import PHASE_COLLECTIVES


class EnvBeatsCommandLine(ReferenceCoC):
    """Legacy environment variables take precedence over command-line flags."""

    name = "fault-env-beats-cli"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        config = super().configure(argv, env, **kw)
        num = (env or {}).get("COC_PARALLEL_NUM")
        if num is not None and config.enabled:
            return CoCConfig(True, int(num), config.fused_kernel, config.user_cfgs)
        return config


class SilentOverrides(ReferenceCoC):
    """Resolves correctly but never says a setting was overridden or ignored."""

    name = "fault-silent"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return super().configure(argv, env, **kw)


class _RefusesMC2(ReferenceCoC):
    """Refuses CoC with MC2 (``use_ascend_mc2``) first of all, raising :meth:`refusal`."""

    def refusal(self) -> Exception:
        raise NotImplementedError

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        if kw.get("use_ascend_mc2"):
            raise self.refusal()
        return super().configure(argv, env, **kw)


class _ConfigureWith(ReferenceCoC):
    """``configure`` with the keywords :meth:`forced` gives replaced (the reference does the rest)."""

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        return super().configure(argv, env, **{**kw, **self.forced(kw)})


class _CollectiveBeforeConfigure(ReferenceCoC):
    """Ranks :meth:`joins` picks issue an all-reduce (to agree on a setting) before ``configure`` validates."""

    def joins(self, rank: int) -> bool:
        raise NotImplementedError

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import torch
        import torch.distributed as dist

        if dist.is_initialized() and self.joins(dist.get_rank()):
            dist.all_reduce(torch.zeros(1))
        return super().configure(argv, env, **kw)


class UntypedErrors(_RefusesMC2):
    """Refuses CoC with MC2, but with a bare ValueError."""

    name = "fault-untyped"

    def refusal(self) -> Exception:
        return ValueError("no")


class AcceptsMoE(_ConfigureWith):
    """Accepts CoC with MoE (``num_experts``): allowed when its results are right, against the documented refusal."""

    name = "fault-accepts-moe"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        return {"num_experts": None}


class AcceptsAnyChunkCount(ReferenceCoC):
    """Lets an unsupported chunk count through."""

    name = "fault-any-chunks"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        argv = [a if a not in ("3", "16", "many") else "2" for a in (argv or [])]
        env = {k: ("2" if k == "COC_PARALLEL_NUM" else v) for k, v in (env or {}).items()}
        return super().configure(argv, env, **kw)


class AcceptsEverything(_ConfigureWith, AcceptsAnyChunkCount):
    """Refuses no incompatible setting (MC2, MoE, 2-D TP, Transformer Engine) and no chunk count."""

    name = "fault-accepts-everything"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        return {"use_ascend_mc2": False, "num_experts": None, "tp_2d": False, "transformer_impl": "local"}


class ChecksOnRankZeroOnly(ReferenceCoC):
    """Validates on rank 0 only; the other ranks go on to a collective (upstream prints on device 0)."""

    name = "fault-rank0-check"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_rank() == 0:
            return super().configure(argv, env, **kw)
        dist.all_reduce(torch.zeros(1))  # e.g. agreeing on a setting
        return resolve_config(None, {}, tp_size=kw["tp_size"])


class AgreesBeforeValidating(_CollectiveBeforeConfigure):
    """Issues a collective (to agree on settings) on every rank before it validates them."""

    name = "fault-collective-first"

    def joins(self, rank: int) -> bool:
        return True


# --- fused-op faults -----------------------------------------------------------------------


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


# --- scripted layer faults -----------------------------------------------------------------


class _PatchedPipeline(ReferenceCoC):
    """Runs the reference patch with one overlap-engine function of ``coc_impl.scripted`` wrapped."""

    target: str = ""

    def wrap(self, original: Any) -> Any:
        raise NotImplementedError

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack
        from unittest import mock

        import coc_impl.scripted as scripted

        stack = ExitStack()
        stack.enter_context(mock.patch.object(scripted, self.target, self.wrap(getattr(scripted, self.target))))
        stack.enter_context(super().patch_megatron(config))
        return stack


def _on_wait(in_flight: Any, change: Any) -> Any:
    """An InFlight whose result is changed by ``change(result)`` when waited for."""
    original_wait = in_flight.wait

    def wait() -> Any:
        return change(original_wait())

    in_flight.wait = wait
    return in_flight


class _ChangesChunkedAllReduce(_PatchedPipeline):
    """The chunked matmul + all-reduce, of more than one chunk, has its result changed by :meth:`changed` when
    waited for."""

    target = "matmul_all_reduce"

    def changed(self, out: Any, blocks: Any) -> None:
        raise NotImplementedError

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            def change(out: Any) -> Any:
                if len(blocks) > 1:
                    self.changed(out, blocks)
                return out

            return _on_wait(original(x, matmul, blocks, group, **kw), change)

        return pipeline


class DropsLastChunk(_ChangesChunkedAllReduce):
    """The chunked matmul + all-reduce leaves its last chunk's rows unwritten (zeros)."""

    name = "fault-drops-chunk"

    def changed(self, out: Any, blocks: Any) -> None:
        out[out.shape[0] - blocks[-1]:] = 0


class DuplicatesFirstChunk(_ChangesChunkedAllReduce):
    """The chunked matmul + all-reduce writes chunk 0's rows again where chunk 1 belongs."""

    name = "fault-duplicates-chunk"

    def changed(self, out: Any, blocks: Any) -> None:
        out[blocks[0]:blocks[0] + blocks[1]] = out[:blocks[1]].clone()


class _ChangesGather(_PatchedPipeline):
    """The chunked all-gather + matmul's result (output and gathered input) replaced by :meth:`changed`."""

    target = "all_gather_matmul"

    def changed(self, result: Any, blocks: Any, group: Any) -> Any:
        raise NotImplementedError

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            return self.changed(original(x, matmul, blocks, group, **kw), blocks, group)

        return pipeline


class GathersChunksInWrongOrder(_ChangesGather):
    """The chunked all-gather + matmul places each rank's chunks in reverse order."""

    name = "fault-gather-order"

    def changed(self, result: Any, blocks: Any, group: Any) -> Any:
        p, tp = len(blocks), group.size()
        if p > 1:
            out = result.output
            out.copy_(out.unflatten(0, (tp, p, blocks[0])).flip(1).flatten(0, 2))
        return result


class _PatchedRowForward(_PatchedPipeline):
    """Runs the reference patch with the backend's ``row_forward`` (the one the patch calls) wrapped."""

    target = "row_forward"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack
        from unittest import mock

        import coc_impl.megatron_patch as patch

        # The patch calls the backend module's row_forward; wrap it there.
        stack = ExitStack()
        backend = patch.backend_for(config)
        if backend is not None:
            stack.enter_context(mock.patch.object(backend, "row_forward", self.wrap(backend.row_forward)))
        stack.enter_context(ReferenceCoC.patch_megatron(self, config))
        return stack


class BiasOnEveryRank(_PatchedRowForward):
    """The row layer adds its bias on every rank before the reduction (tp times in all)."""

    name = "fault-bias-every-rank"

    def wrap(self, original: Any) -> Any:
        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            out = original(x, weight, None, **kw)
            return out if bias is None else out + kw["group"].size() * bias

        return row_forward


class IgnoresCustomizedCoC(ReferenceCoC):
    """Uses ``parallel_num`` for every shape, ignoring ``customized_coc``."""

    name = "fault-ignores-customized"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from dataclasses import replace

        return super().patch_megatron(replace(config, user_cfgs=replace(config.user_cfgs, customized_coc={})))


class PatchNotApplied(ReferenceCoC):
    """Accepts every configuration but never patches megatron: silently serial."""

    name = "fault-not-patched"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import nullcontext

        return nullcontext()


class StaleSavedGather(_ChangesGather):
    """With ``recompute_all_gather=False`` the saved gathered input is a stale buffer."""

    name = "fault-stale-gather"

    def changed(self, result: Any, blocks: Any, group: Any) -> Any:
        if result.gathered is None:
            return result
        # e.g. a reused communication buffer, overwritten before the backward reads it
        return type(result)(result.output, result.gathered.clone().zero_())


# --- uneven token counts, silent serial paths, blocking "async" calls (issue classes of real patches) ----


class UnevenTokensGarbageRows(ReferenceCoC):
    """m % p != 0: floor-sized chunks, the remainder rows never computed (as MindSpeed's lcal_coc does)."""

    name = "fault-uneven-garbage"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack
        from unittest import mock

        import coc_impl.overlap as overlap
        import coc_impl.scripted as scripted

        def chunks(config: CoCConfig, *, m: int, k: int, n: int, **kw: Any) -> int:
            p = config.chunks_for(m, k, n)
            return 1 if p == "auto" or m < p else p  # never refuses

        def floor_blocks(total: int, parts: int, *, what: str = "") -> list[int]:
            return [total // parts] * parts  # leaves total % parts rows out

        stack = ExitStack()
        stack.enter_context(mock.patch.object(scripted, "resolve_chunks", chunks))
        stack.enter_context(mock.patch.object(scripted, "equal_blocks", floor_blocks))
        stack.enter_context(mock.patch.object(overlap, "validate_blocks", lambda blocks, total, what: tuple(blocks)))
        stack.enter_context(super().patch_megatron(config))
        return stack


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


class FusedRowSilentlySerial(ReferenceCoC):
    """Under --coc-fused-kernel the row layer falls back to megatron's one synchronous all-reduce."""

    name = "fault-fused-row-serial"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack

        from coc_shared.megatron import RowParallelLinear

        stack = ExitStack()
        stack.enter_context(super().patch_megatron(config))
        if config.fused_kernel:
            patched = RowParallelLinear.__dict__["forward"]
            stack.callback(setattr, RowParallelLinear, "forward", patched)
            RowParallelLinear.forward = patched.__wrapped__  # megatron's own forward
        return stack


def _waited_at_once(launch: Any, partial: Any, out: Any) -> Any:
    """An all-reduce of ``partial`` into ``out``, launched asynchronously by ``launch(out)`` and waited for at once:
    nothing can overlap it."""
    if out.data_ptr() != partial.data_ptr():
        out.copy_(partial)
    work = launch(out)
    work.wait()
    return work


class AsyncFlagButBlocking(_PatchedPipeline):
    """Passes async_op=True positionally, then waits at once: the chunks never overlap anything."""

    name = "fault-async-but-blocking"
    target = "matmul_all_reduce"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            import torch.distributed as dist

            from coc_impl import overlap

            class Blocking(overlap.CollectiveReducer):
                def all_reduce(self, partial: Any, out: Any, group: Any) -> Any:
                    return _waited_at_once(lambda t: dist.all_reduce(t, dist.ReduceOp.SUM, group, True), partial, out)

            return original(x, matmul, blocks, group, reducer=Blocking(), **kw)

        return pipeline


def _whole_blocking_gather(x: Any, matmul: Any, group: Any) -> Any:
    """The all-gather + matmul done serially: ``x`` gathered whole in one blocking all-gather, then multiplied."""
    import torch
    import torch.distributed as dist

    from coc_impl.overlap import GatherMatmulResult

    gathered = torch.empty((x.shape[0] * group.size(), *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)  # blocking, whole
    return GatherMatmulResult(matmul(gathered), gathered)


class MlpSpBackwardGatherSerial(_PatchedPipeline):
    """The row layer's SP backward gathers dy in one synchronous all-gather (caught inside the MLP too)."""

    name = "fault-mlp-sp-backward-serial"
    target = "all_gather_matmul"

    def wrap(self, original: Any) -> Any:
        import sys

        import coc_impl.scripted as scripted

        row_backward = inspect.unwrap(scripted._RowParallelMatmul.backward).__code__

        def all_gather_matmul(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            if sys._getframe(1).f_code is not row_backward:
                return original(x, matmul, blocks, group, **kw)
            return _whole_blocking_gather(x, matmul, group)

        return all_gather_matmul


# --- bug classes that escaped other suites: wrong group, results that change, training steps ------


class WrongGroupOps(_EveryOp):
    """Every op runs its collectives on the default (world) group instead of the TP group it is given."""

    name = "fault-wrong-group-ops"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch.distributed as dist

        return super().through(op, x, w, bias, {**kw, "group": dist.group.WORLD})


class WrongGroupLayers(_PatchedPipeline):
    """The patched row layer all-reduces over the world group, not the layer's TP group."""

    name = "fault-wrong-group-layers"
    target = "matmul_all_reduce"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            import torch.distributed as dist

            return original(x, matmul, blocks, dist.group.WORLD, **kw)

        return pipeline


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


class StaleWeightCache(_PatchedPipeline):
    """The patched layers cache each weight's product operand on first use: later steps use stale weights."""

    name = "fault-stale-weight-cache"
    target = "rows_times"

    def wrap(self, original: Any) -> Any:
        cache: dict[tuple[int, tuple[int, ...]], Any] = {}

        def rows_times(right: Any, **kw: Any) -> Any:
            key = (right.data_ptr(), tuple(right.shape))
            if key not in cache:
                cache[key] = original(right.detach().clone(), **kw)
            return cache[key]

        return rows_times


class _WeightGradFault(_PatchedPipeline):
    """The layers' weight gradient taken by :meth:`weight_grad` (the reference's own ``original`` at hand)."""

    target = "_weight_grad"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        raise NotImplementedError

    def wrap(self, original: Any) -> Any:
        return functools.partial(self.weight_grad, original)


class LostGradAccumulation(_WeightGradFault):
    """With gradient-accumulation fusion the weight gradient overwrites main_grad instead of adding to it."""

    name = "fault-lost-grad-accumulation"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        if fusion and hasattr(weight, "main_grad"):
            weight.main_grad.zero_()
        return original(weight, grad_output, total_input, fusion)


class GradInBothPlaces(_WeightGradFault):
    """With fusion the gradient goes into main_grad and also, unmarked, into .grad (added twice by DDP)."""

    name = "fault-grad-in-both-places"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        result = original(weight, grad_output, total_input, fusion)
        if fusion and hasattr(weight, "main_grad"):
            if hasattr(weight, "grad_added_to_main_grad"):
                weight.grad_added_to_main_grad = False
            return grad_output.t().matmul(total_input)
        return result


class ReusedOutputWorkspace(_PatchedPipeline):
    """The row layer returns its output in one persistent workspace: kept outputs change under later calls."""

    name = "fault-reused-workspace"
    target = "row_forward"

    def wrap(self, original: Any) -> Any:
        workspace: dict[tuple[Any, int], Any] = {}

        import torch

        class IntoWorkspace(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, out: Any) -> Any:
                key = (out.dtype, out.shape[-1])
                if key not in workspace or workspace[key].numel() < out.numel():
                    workspace[key] = torch.empty(max(out.numel(), 1 << 16), dtype=out.dtype)
                # Shares the workspace's memory without being a view of it (as a kernel's output would):
                # the next call overwrites it.
                alias = torch.empty(0, dtype=out.dtype).set_(workspace[key].untyped_storage(), 0, out.shape)
                return alias.copy_(out)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            return IntoWorkspace.apply(original(x, weight, bias, **kw))

        return row_forward


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


class WritesIntoItsInput(_WeightGradFault):
    """The layers' backward reuses the saved input as scratch once the weight gradient is taken: the input changes."""

    name = "fault-writes-into-input"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        result = original(weight, grad_output, total_input, fusion)
        total_input.detach().mul_(0.5)  # every number already computed is right
        return result


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


class DeclaresNoOverlap(ReferenceCoC):
    """Declares every layer phase not overlapped (``none``): its overlap structure has nothing to be judged on."""

    name = "fault-declares-no-overlap"
    overlap = {key: "none" for key in PHASE_COLLECTIVES}


# --- bad input: results that are not results, resources left behind ------------------------------


class _ResultFault(ReferenceCoC):
    """matmul_all_reduce returns ``self.bad(result)`` instead of its result."""

    def bad(self, result: Any) -> Any:
        raise NotImplementedError

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.bad(super().matmul_all_reduce(x, w, bias, **kw))


class ReturnsNone(_ResultFault):
    name = "fault-returns-none"

    def bad(self, result: Any) -> Any:
        return None


class ReturnsList(_ResultFault):
    name = "fault-returns-list"

    def bad(self, result: Any) -> Any:
        return result.tolist()


class ReturnsWrongShape(_ResultFault):
    name = "fault-wrong-shape"

    def bad(self, result: Any) -> Any:
        return result[:-1]


class ReturnsWrongShapeTwice(ReturnsWrongShape):
    """The same fault, and now all_gather_matmul too (a new fault on top of a known one)."""

    name = "fault-wrong-shape-twice"

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        return self.bad(super().all_gather_matmul(x, w, bias, **kw))


class ReturnsWrongDtype(_ResultFault):
    name = "fault-wrong-dtype"

    def bad(self, result: Any) -> Any:
        return result.double()


class ReturnsOnAnotherDevice(_ResultFault):
    name = "fault-wrong-device"

    def bad(self, result: Any) -> Any:
        return result.to("meta")


class LeaksProcessGroups(ReferenceCoC):
    """Creates a new process group on every call and never destroys it."""

    name = "fault-leaks-groups"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        ranks = dist.get_process_group_ranks(kw["group"])
        kw["group"] = dist.new_group(ranks)
        return super().matmul_all_reduce(x, w, bias, **kw)


class ConfigureHangsOnOneRank(_CollectiveBeforeConfigure):
    """configure waits in a collective on rank 1 only: every other rank returns."""

    name = "fault-configure-hangs"

    def joins(self, rank: int) -> bool:
        return rank == 1


class ConfigureRaisesOnOneRank(_ConfigureWith):
    """configure refuses MC2 on rank 0 only."""

    name = "fault-configure-raises-once"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        import torch.distributed as dist

        return {"use_ascend_mc2": False} if dist.is_initialized() and dist.get_rank() != 0 else {}


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


class KillsItsTestProcess(ReferenceCoC):
    """configure of the plain fused flags at TP 8 kills the process calling it (an xdist worker, in-process)."""

    name = "fault-kills-worker"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import os
        import signal

        if list(argv or ()) == ["--use-ascend-coc", "--coc-fused-kernel"] and kw.get("tp_size") == 8:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().configure(argv, env, **kw)


class ExitsItsTestProcess(ReferenceCoC):
    """configure of the plain fused flags at TP 8 calls ``os._exit(0)`` in the process calling it (issue 50: in one
    pytest process the run ended, exit status 0, with no summary)."""

    name = "fault-exits-with-zero"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import os

        if list(argv or ()) == ["--use-ascend-coc", "--coc-fused-kernel"] and kw.get("tp_size") == 8:
            os._exit(0)
        return super().configure(argv, env, **kw)


# --- corners of the case space: faults the regular corner of the catalogue never meets ------------------


class _EveryOpOutput(_EveryOp):
    """Every op's output (the first of V2's pair) is replaced by ``self.bad(output)``."""

    def bad(self, output: Any) -> Any:
        raise NotImplementedError

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        result = super().through(op, x, w, bias, kw)
        return (self.bad(result[0]), result[1]) if isinstance(result, tuple) else self.bad(result)


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


class TP1RowDropsBias(_PatchedRowForward):
    """Takes the CoC row path at every TP size; at TP 1 it skips the (trivial) reduction and the bias added after it."""

    name = "fault-tp1-row-drops-bias"

    def wrap(self, original: Any) -> Any:
        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            return original(x, weight, None if kw["group"].size() == 1 else bias, **kw)

        return row_forward

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack
        from unittest import mock

        import coc_impl.megatron_patch as patch

        stack = ExitStack()
        stack.enter_context(mock.patch.object(patch, "_row_uses_coc", lambda layer: not layer.explicit_expert_comm))
        stack.enter_context(super().patch_megatron(config))
        return stack


class RawPointerWeight(_EveryOp):
    """A raw-pointer kernel: reads ``w`` from the start of its storage as if contiguous (``w.contiguous()`` missing)."""

    name = "fault-raw-pointer-weight"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        import torch

        as_if_contiguous = torch.empty(0, dtype=w.dtype).set_(w.untyped_storage(), 0, w.shape)
        return super().through(op, x, as_if_contiguous, bias, kw)


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


class SharedWorkspaceBetweenOps(_RecycledOutput):
    """The gathers' output buffer is recycled as the reduce ops' scratch: a reduce after a gather overwrites it."""

    name = "fault-shared-workspace-between-ops"

    def kept(self, op: str) -> bool:
        return op.startswith("all_gather")

    def stages(self, op: str) -> bool:
        return not op.startswith("all_gather")


class Group128MisIndexed(ReferenceCoC):
    """w8A16 with group size 128: each k row takes the next group's scale and offset (an off-by-one group index)."""

    name = "fault-group128-misindexed"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if kw.get("antiquant_group_size") == 128:
            for name in ("antiquant_scale", "antiquant_offset"):
                if kw.get(name) is not None:
                    kw[name] = kw[name].roll(-1, 0)
        return super().matmul_all_reduce(x, w, bias, **kw)


class AutocastOutputInInputDtype(_PatchedRowForward):
    """The row layer's output buffer takes the input's dtype: under autocast the bfloat16 result's bytes land in a
    float32 buffer (sized and typed from the input, not from the product)."""

    name = "fault-autocast-input-dtype"

    def wrap(self, original: Any) -> Any:
        import torch

        class IntoInputDtype(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, out: Any, input_dtype: Any) -> Any:
                ctx.dtype = out.dtype
                buffer = torch.zeros(out.shape, dtype=input_dtype)
                raw = out.contiguous().view(-1).view(torch.uint8)
                buffer.view(-1).view(torch.uint8)[: raw.numel()].copy_(raw)  # the kernel writes its own dtype's bytes
                return buffer

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad.to(ctx.dtype), None

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            product = IntoInputDtype.apply(original(x, weight, None, **kw), x.dtype)
            return product if bias is None else product + bias

        return row_forward


# --- one check each: settings, refusals and warnings the other faults leave alone -------------------


class RefusesMC2WhileOff(_RefusesMC2):
    """Refuses MC2 before looking whether CoC is enabled at all: a run without CoC cannot use MC2."""

    name = "fault-refuses-mc2-while-off"

    def refusal(self) -> Exception:
        from coc_impl.errors import CoCWithMC2Error

        return CoCWithMC2Error("CoC cannot be combined with MC2 (use_ascend_mc2)")


class IgnoresRecomputeAllGather(ReferenceCoC):
    """Ignores ``recompute_all_gather=False``: the column backward all-gathers its input again."""

    name = "fault-ignores-recompute-all-gather"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from dataclasses import replace

        return super().patch_megatron(replace(config, user_cfgs=replace(config.user_cfgs, recompute_all_gather=True)))


class _ChunkPolicy(ReferenceCoC):
    """Runs the reference patch with ``coc_impl.scripted.resolve_chunks`` replaced by ``self.resolve``."""

    def resolve(self, original: Any, config: CoCConfig, **kw: Any) -> int:
        raise NotImplementedError

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack
        from functools import partial
        from unittest import mock

        import coc_impl.scripted as scripted

        stack = ExitStack()
        resolve = partial(self.resolve, scripted.resolve_chunks)
        stack.enter_context(mock.patch.object(scripted, "resolve_chunks", resolve))
        stack.enter_context(super().patch_megatron(config))
        return stack


class RefusesUnevenTokensVaguely(_ChunkPolicy):
    """Refuses token counts no chunk count divides, on every rank, without saying which m or p."""

    name = "fault-refuses-uneven-vaguely"

    def resolve(self, original: Any, config: CoCConfig, **kw: Any) -> int:
        from coc_impl.errors import CoCShapeError

        try:
            return int(original(config, **kw))
        except CoCShapeError:
            raise CoCShapeError("CoC: the token count does not split into the requested chunks") from None


class FallsBackSilently(_ChunkPolicy):
    """With fewer rows than chunks, runs unchunked without the fallback warning."""

    name = "fault-falls-back-silently"

    def resolve(self, original: Any, config: CoCConfig, **kw: Any) -> int:
        from coc_impl.chunking import FallbackNotice

        return int(original(config, **{**kw, "notice": FallbackNotice(given=True)}))


class RaisesOnOneRankAfterReducing(ReferenceCoC):
    """matmul_all_reduce: rank 1 raises once its all-reduce is done (e.g. releasing a workspace); rank 0 returns."""

    name = "fault-raises-on-one-rank"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        out = super().matmul_all_reduce(x, w, bias, **kw)
        if dist.get_rank(kw["group"]) == 1:
            raise RuntimeError("workspace release failed")
        return out


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


class UnfusedWeightGrad(_WeightGradFault):
    """Under gradient-accumulation fusion the weight gradient comes back as a full ``.grad``; main_grad untouched."""

    name = "fault-unfused-weight-grad"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        return original(weight, grad_output, total_input, False)


# --- a verdict once seen is never lost (issue 43): failures before refusals, one op of a sequence absent -----------


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


class _NoGather(_EveryOp):
    """Offers no all-gather op: both raise ``NotImplementedError`` on every rank."""

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        if op.startswith("all_gather"):
            raise NotImplementedError("no all-gather ops in this build")
        return super().through(op, x, w, bias, kw)


class NoGatherZeroScatter(_NoGather):
    """Offers no all-gather op, and its reduce-scatter returns zeros: in a sequence after a gather the zeros must
    still be judged (the gather is not offered; the scatter's numbers are wrong)."""

    name = "fault-no-gather-zero-scatter"

    def through(self, op: str, x: Any, w: Any, bias: Any, kw: dict[str, Any]) -> Any:
        result = super().through(op, x, w, bias, kw)
        return result.zero_() if op == "matmul_reduce_scatter" else result


# --- correct variants: what the checks must pass (or skip) ----------------------------------------


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
        import torch.distributed as dist

        ranks = tuple(dist.get_process_group_ranks(kw["group"]))
        if ranks not in self._groups:  # created once per group, on the first call (no leak per call)
            self._groups[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)
        return super().matmul_all_reduce(x, w, bias, **{**kw, "group": self._groups[ranks]})


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

# --- explorer-only faults: corners the fixed suite does not reach (issue 23; found by --coc-explore) ------------


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


# --- issue 26: collectives through names bound at the implementation's import; shapes that coincide ------------


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
        import coc_impl.overlap

        stack = ExitStack()
        for module in (coc_impl.overlap, coc_impl.deterministic):
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

        import coc_impl.overlap as overlap

        def all_reduce(partial: Any, out: Any, group: Any) -> Any:
            return _waited_at_once(lambda t: MYDIST.all_reduce(t, group=group, async_op=True), partial, out)

        stack = super().patch_megatron(config)
        stack.enter_context(mock.patch.object(overlap.SUM_REDUCER, "all_reduce", all_reduce))
        return stack


class DeclaresOverlapsOutput(ReferenceCoC):
    """Correct: declares that the SP column forward's all-gather overlaps the output matmul (it does, chunked)."""

    name = "variant-declares-overlaps-output"
    overlap = {**ReferenceCoC.overlap, "column/sp/forward": "overlaps:output"}


class SerialGatherDeclaredOverlapsOutput(_PatchedPipeline):
    """Declares the SP forward all-gather overlaps the output matmul, but gathers x whole, blocking, first."""

    name = "fault-serial-gather-declared-overlaps-output"
    overlap = DeclaresOverlapsOutput.overlap
    target = "all_gather_matmul"

    def wrap(self, original: Any) -> Any:
        def all_gather_matmul(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            return _whole_blocking_gather(x, matmul, group)

        return all_gather_matmul


# --- explorer honesty: refusals the rule does not allow, an implementation offering no op ---------------------


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


class OffersNoOp(ReferenceCoC):
    """Correct, offering no fused op at all: every call raises ``NotImplementedError`` (nothing to judge)."""

    name = "variant-offers-no-op"

    def _absent(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError("no fused ops in this build")

    matmul_all_reduce = matmul_reduce_scatter = all_gather_matmul = all_gather_matmul_v2 = _absent


class AcceptsTpZeroAndMc2(_ConfigureWith):
    """Accepts both a TP size of 0 (as 1) and CoC with MC2: two configuration defects, one finding each."""

    name = "fault-accepts-tp-zero-and-mc2"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        return {"use_ascend_mc2": False, "tp_size": kw.get("tp_size") or 1}


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


# --- state kept on the backward's thread (an accelerator runs every backward of a device on one thread) -------


class _BackwardThreadWorkspace(_PatchedPipeline):
    """The backward keeps each weight's product operand in a per-thread workspace (a ``threading.local``, as a
    workspace pool per stream or thread is), found again by :meth:`key`; the forward uses the weight as is."""

    target = "rows_times"

    def key(self, weight: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def wrap(self, original: Any) -> Any:
        import threading

        import torch

        workspace = threading.local()

        def rows_times(right: Any, **kw: Any) -> Any:
            if torch.is_grad_enabled():  # the forward
                return original(right, **kw)
            kept = workspace.__dict__.setdefault("operands", {})
            key = self.key(right)
            if key not in kept:
                kept[key] = original(right.detach().clone(), **kw)
            return kept[key]

        return rows_times


class StaleBackwardThreadWorkspace(_BackwardThreadWorkspace):
    """Keyed by the weight's storage alone: on a device's one backward thread the operand of the first step is
    used again after the optimizer updated the weight in place (a fresh thread per backward never shows it)."""

    name = "fault-stale-backward-thread-workspace"

    def key(self, weight: Any) -> tuple[Any, ...]:
        return weight.data_ptr(), tuple(weight.shape)


# --- work the probes cannot follow (a helper thread) beside a fault they can see -------------------------------


def _helper_thread_matmul() -> None:
    """A 2x2 matmul on a helper thread, started and joined: work no recording mode reaches."""
    import threading

    import torch

    helper = threading.Thread(target=lambda: torch.ones(2, 2) @ torch.ones(2, 2), name="coc-helper")
    helper.start()
    helper.join()


class SerialBackwardBesideAHelperMatmul(MlpSpBackwardGatherSerial):
    """``MlpSpBackwardGatherSerial`` (the row SP backward, declared chunked, gathers serially), and a 2x2 matmul on
    a helper thread in the column forward: that phase is not judged, the serial backward still fails (issue 50: the
    first phase not judged ended the structure check, "not judged")."""

    name = "fault-serial-backward-beside-a-helper-matmul"

    def wrap(self, original: Any) -> Any:
        import sys

        import coc_impl.scripted as scripted

        row_backward = inspect.unwrap(scripted._RowParallelMatmul.backward).__code__

        def all_gather_matmul(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            if sys._getframe(1).f_code is row_backward:
                return _whole_blocking_gather(x, matmul, group)
            _helper_thread_matmul()
            return original(x, matmul, blocks, group, **kw)

        return all_gather_matmul


class RegathersOnAHelperThread(_PatchedPipeline):
    """Ignores ``recompute_all_gather=False``, and gathers the input again for the weight gradient on a helper
    thread, where no probe records it: the check cannot see the re-gather, so it must not pass (issue 50)."""

    name = "fault-regathers-on-a-helper-thread"
    target = "all_gather"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from dataclasses import replace

        return super().patch_megatron(replace(config, user_cfgs=replace(config.user_cfgs, recompute_all_gather=True)))

    def wrap(self, original: Any) -> Any:
        import threading

        class Gathered:
            def __init__(self, value: Any) -> None:
                self.value = value

            def wait(self) -> Any:
                return self.value

        def all_gather(x: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            box: dict[str, Any] = {}
            helper = threading.Thread(target=lambda: box.update(out=original(x, blocks, group, **kw).wait()),
                                      name="coc-regather")
            helper.start()
            helper.join()
            return Gathered(box["out"])

        return all_gather


class CallbackFromBeforeTheRecording(_PatchedPipeline):
    """Registers at ``configure`` (before any recording) a callback that multiplies, on a future a thread started
    then completes during the next layer forward: that matmul is not in the phase's timeline, so its structure must
    not be judged (issue 50: whether to watch a callback was decided when it was registered)."""

    name = "fault-callback-from-before-the-recording"
    target = "matmul_all_reduce"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import threading

        import torch

        later: Any = torch.futures.Future()
        later.then(lambda _: torch.ones(2, 2) @ torch.ones(2, 2))
        go = threading.Event()
        self.go, self.completer = go, threading.Thread(target=lambda: (go.wait(), later.set_result(None)),
                                                       name="coc-completer", daemon=True)
        self.completer.start()
        return super().configure(argv, env, **kw)

    def wrap(self, original: Any) -> Any:
        def pipeline(*args: Any, **kw: Any) -> Any:
            completer = getattr(self, "completer", None)
            if completer is not None and completer.is_alive():
                self.go.set()
                completer.join()
            return original(*args, **kw)

        return pipeline


class ScatterPiecesOfTwoShapes(ReferenceCoC):
    """matmul_reduce_scatter drops its last column on every rank but 0: the ranks' pieces are no shards of one
    tensor (issue 50: assembling them raised, a suite error that dropped the failures recorded before it)."""

    name = "fault-scatter-pieces-of-two-shapes"

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        out = super().matmul_reduce_scatter(x, w, bias, **kw)
        return out if dist.get_rank(kw.get("group")) == 0 else out[:, :-1].contiguous()


# --- a wrong result beside a refusal in one case (issue 50: the refusal made the whole case "not offered") -----


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


class WrongLongMicroBatchRefusesShortOne(_PatchedRowForward):
    """The row layer: its longer micro-batch comes back one row off (rolled by one), the shorter one (half its
    tokens) raises ``NotImplementedError``: a training step of both ended "not offered", skipped (issue 50)."""

    name = "fault-wrong-long-micro-batch-refuses-short-one"

    def wrap(self, original: Any) -> Any:
        import torch

        longest: list[int] = []

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            tokens = x.shape[0]
            longest[:] = [max([tokens, *longest])]
            if tokens < longest[0]:
                raise NotImplementedError(f"micro-batches of {tokens} tokens are not implemented")
            return torch.roll(original(x, weight, bias, **kw), 1, 0)

        return row_forward


class RowLayerTypeError(_PatchedRowForward):
    """The patched row layer raises a ``TypeError`` of its own on every rank: no refusal, a crash of its code."""

    name = "fault-row-layer-type-error"

    def wrap(self, original: Any) -> Any:
        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            raise TypeError("unsupported operand type(s) for +: 'NoneType' and 'Tensor'")

        return row_forward


# --- bits fixed per process (issue 50: three sessions at TP 4 gave three digests, each passed) -----------------


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


# --- misuses of torch_npu's MC2 kernels (judged on the emulated NPU node: --coc-emulate-npu) ----------------------


class _CallsMc2Itself(ReferenceCoCAuto):
    """The all-reduce on torch_npu's ``npu_mm_all_reduce_base`` where the reference's binding would take the call
    (``coc_impl.backends.ascend.check``), called here by :meth:`all_reduce_on_mc2`; everything else is the
    reference with ``backend="auto"``."""

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        from coc_impl.backends import ascend
        from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable
        from coc_impl.validated_call import ValidatedCall

        call = ValidatedCall.validate("matmul_all_reduce", x, w, bias, **kw)
        try:
            ascend.check(call)
        except (CoCBackendUnavailable, CoCArgumentError):
            return super().matmul_all_reduce(x, w, bias, **kw)
        if call.deterministic or call.antiquant is not None or call.blocks is not None:
            return super().matmul_all_reduce(x, w, bias, **kw)
        return self.all_reduce_on_mc2(call)

    def all_reduce_on_mc2(self, call: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def kernel(x1: Any, x2: Any, group: Any, **kw: Any) -> Any:
        """``npu_mm_all_reduce_base`` over ``group``'s HCCL communicator."""
        import torch
        import torch.distributed as dist

        hccl = group._get_backend(torch.device("npu"))
        hcom = hccl.get_hccl_comm_name(dist.get_global_rank(group, group.rank()))
        return torch.ops.npu.npu_mm_all_reduce_base(x1.contiguous(), x2, hcom, reduce_op="sum", **kw)


class BiasIntoAllReduceKernel(_CallsMc2Itself):
    """Hands the bias to ``npu_mm_all_reduce_base``, whose documented formula is ``allreduce(x1 @ x2 + bias)``:
    every rank adds it before the reduction, so the result carries it ``tp`` times."""

    name = "fault-bias-into-mc2-all-reduce"

    def all_reduce_on_mc2(self, call: Any) -> Any:
        return self.kernel(call.x, call.w.t() if call.transpose_weight else call.w, call.group, bias=call.bias)


class TransposeFlagLost(_CallsMc2Itself):
    """A weight stored ``[n, k]`` (``transpose_weight=True``) goes to the kernel as a contiguous copy of its storage,
    shaped ``[k, n]``: MC2 reads ``x2``'s transpose flag from its layout (the transposed view of an ND ``[n, k]``
    tensor), so without the view it multiplies by another matrix."""

    name = "fault-mc2-transpose-flag-lost"

    def all_reduce_on_mc2(self, call: Any) -> Any:
        x2 = call.w.contiguous().view(call.k, call.n) if call.transpose_weight else call.w
        return call.add_bias(self.kernel(call.x, x2, call.group))


class SecondMc2Domain(_CallsMc2Itself):
    """Overlaps two MC2 kernels by giving each half of the rows a communicator of its own (a duplicate of the TP
    group): on Atlas A2 every MC2 operator of a process must use one communication domain (CANN
    aclnnMatmulAllReduce), so the second half's kernel is refused."""

    name = "fault-second-mc2-domain"

    def __init__(self) -> None:
        super().__init__()
        self._duplicates: dict[tuple[int, ...], Any] = {}

    def all_reduce_on_mc2(self, call: Any) -> Any:
        import torch
        import torch.distributed as dist

        ranks = tuple(dist.get_process_group_ranks(call.group))
        if ranks not in self._duplicates:
            self._duplicates[ranks] = dist.new_group(list(ranks), use_local_synchronization=True)
        w = call.w.t() if call.transpose_weight else call.w
        half = call.m // 2
        if not half:
            return call.add_bias(self.kernel(call.x, w, call.group))
        halves = [self.kernel(call.x[:half], w, call.group), self.kernel(call.x[half:], w, self._duplicates[ranks])]
        return call.add_bias(torch.cat(halves))
