"""Deliberately broken implementations: proof that the conformance checks bite.

Each is a small subclass of the reference with one defect; tests in
``tests/test_suite_bites.py`` run the suite against them and expect the named
checks to fail.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from coc_impl.config import CoCConfig, resolve_config
from coc_impl.reference import ReferenceCoC


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


class UntypedErrors(ReferenceCoC):
    """Refuses CoC with MC2, but with a bare ValueError."""

    name = "fault-untyped"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        if kw.get("use_ascend_mc2"):
            raise ValueError("no")
        return super().configure(argv, env, **kw)


class AcceptsAnyChunkCount(ReferenceCoC):
    """Lets an unsupported chunk count through."""

    name = "fault-any-chunks"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        argv = [a if a not in ("3", "16", "many") else "2" for a in (argv or [])]
        env = {k: ("2" if k == "COC_PARALLEL_NUM" else v) for k, v in (env or {}).items()}
        return super().configure(argv, env, **kw)


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


class AgreesBeforeValidating(ReferenceCoC):
    """Issues a collective (to agree on settings) before it validates them."""

    name = "fault-collective-first"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
        return super().configure(argv, env, **kw)


# --- fused-op faults (SPEC §4) -------------------------------------------------------------


class ArrivalOrderReduction(ReferenceCoC):
    """Claims ``deterministic=True`` but sums the ranks' partials in the order they arrive."""

    name = "fault-arrival-order"

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        if not kw.pop("deterministic", False):
            return super().matmul_all_reduce(x, w, bias, **kw)
        import random

        import torch
        import torch.distributed as dist

        kw.pop("blocks", None)
        group = kw["group"]
        tp = dist.get_world_size(group)
        wk = w.T if kw.get("transpose_weight") else w
        partial = x.float() @ wk.float()
        gathered = torch.empty((tp * partial.shape[0], partial.shape[1]))
        dist.all_gather_into_tensor(gathered, partial, group=group)
        parts = list(gathered.view(tp, *partial.shape))
        random.shuffle(parts)  # whichever rank's block "arrived" first
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return (total if bias is None else total + bias.float()).to(x.dtype)


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


class SquareWeightTransposed(ReferenceCoC):
    """Infers transposition from shapes: a square weight is taken as ``[n, k]``."""

    name = "fault-square-transposed"

    def _fix(self, w: Any, kw: dict[str, Any]) -> None:
        if w.shape[0] == w.shape[1]:
            kw["transpose_weight"] = True

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        self._fix(w, kw)
        return super().matmul_all_reduce(x, w, bias, **kw)

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        self._fix(w, kw)
        return super().all_gather_matmul(x, w, bias, **kw)


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


# --- scripted layer faults (SPEC §3, §9) ----------------------------------------------------


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


class DropsLastChunk(_PatchedPipeline):
    """The chunked matmul + all-reduce leaves its last chunk's rows unwritten (zeros)."""

    name = "fault-drops-chunk"
    target = "matmul_all_reduce"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            def drop(out: Any) -> Any:
                if len(blocks) > 1:
                    out[out.shape[0] - blocks[-1]:] = 0
                return out

            return _on_wait(original(x, matmul, blocks, group, **kw), drop)

        return pipeline


class DuplicatesFirstChunk(_PatchedPipeline):
    """The chunked matmul + all-reduce writes chunk 0's rows again where chunk 1 belongs."""

    name = "fault-duplicates-chunk"
    target = "matmul_all_reduce"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            def duplicate(out: Any) -> Any:
                if len(blocks) > 1:
                    out[blocks[0]:blocks[0] + blocks[1]] = out[:blocks[1]].clone()
                return out

            return _on_wait(original(x, matmul, blocks, group, **kw), duplicate)

        return pipeline


class GathersChunksInWrongOrder(_PatchedPipeline):
    """The chunked all-gather + matmul places each rank's chunks in reverse order."""

    name = "fault-gather-order"
    target = "all_gather_matmul"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            result = original(x, matmul, blocks, group, **kw)
            p, tp = len(blocks), group.size()
            if p > 1:
                out = result.output
                out.copy_(out.unflatten(0, (tp, p, blocks[0])).flip(1).flatten(0, 2))
            return result

        return pipeline


class BiasOnEveryRank(_PatchedPipeline):
    """The row layer adds its bias on every rank before the reduction (tp times in all)."""

    name = "fault-bias-every-rank"
    target = "row_forward"

    def wrap(self, original: Any) -> Any:
        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            out = original(x, weight, None, **kw)
            return out if bias is None else out + kw["group"].size() * bias

        return row_forward

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


class StaleSavedGather(_PatchedPipeline):
    """With ``recompute_all_gather=False`` the saved gathered input is a stale buffer."""

    name = "fault-stale-gather"
    target = "all_gather_matmul"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            result = original(x, matmul, blocks, group, **kw)
            if result.gathered is None:
                return result
            # e.g. a reused communication buffer, overwritten before the backward reads it
            return type(result)(result.output, result.gathered.clone().zero_())

        return pipeline
