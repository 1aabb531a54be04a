"""Faults of the patched Megatron layers' numbers and settings: chunks dropped, duplicated or reordered, a bias added
on every rank, settings ignored, uneven token counts mishandled."""

from __future__ import annotations

from functools import partial
from typing import Any

from coc_impl.config import CoCConfig
from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _patched, _PatchedPipeline, _PatchedRowForward, _with_user_cfgs


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
        return super().patch_megatron(_with_user_cfgs(config, customized_coc={}))


class StaleSavedGather(_ChangesGather):
    """With ``recompute_all_gather=False`` the saved gathered input is a stale buffer."""

    name = "fault-stale-gather"

    def changed(self, result: Any, blocks: Any, group: Any) -> Any:
        if result.gathered is None:
            return result
        # e.g. a reused communication buffer, overwritten before the backward reads it
        return type(result)(result.output, result.gathered.clone().zero_())


class UnevenTokensGarbageRows(ReferenceCoC):
    """m % p != 0: floor-sized chunks, the remainder rows never computed (as MindSpeed's lcal_coc does)."""

    name = "fault-uneven-garbage"

    def patch_megatron(self, config: CoCConfig) -> Any:
        import coc_impl.block_policy as block_policy
        import coc_impl.overlap as overlap

        def chunks(config: CoCConfig, *, m: int, k: int, n: int, **kw: Any) -> int:
            p = config.chunks_for(m, k, n)
            return 1 if p == "auto" or m < p else p  # never refuses

        def floor_blocks(total: int, parts: int, *, what: str = "") -> list[int]:
            return [total // parts] * parts  # leaves total % parts rows out

        return _patched(partial(super().patch_megatron, config), (block_policy, "resolve_chunks", chunks),
                        (block_policy, "equal_blocks", floor_blocks),
                        (overlap, "validate_blocks", lambda blocks, total, what: tuple(blocks)))


class IgnoresRecomputeAllGather(ReferenceCoC):
    """Ignores ``recompute_all_gather=False``: the column backward all-gathers its input again."""

    name = "fault-ignores-recompute-all-gather"

    def patch_megatron(self, config: CoCConfig) -> Any:
        return super().patch_megatron(_with_user_cfgs(config, recompute_all_gather=True))


class _ChunkPolicy(ReferenceCoC):
    """Runs the reference patch with ``coc_impl.block_policy.resolve_chunks`` replaced by ``self.resolve``."""

    def resolve(self, original: Any, config: CoCConfig, **kw: Any) -> int:
        raise NotImplementedError

    def patch_megatron(self, config: CoCConfig) -> Any:
        import coc_impl.block_policy as block_policy

        resolve = partial(self.resolve, block_policy.resolve_chunks)
        return _patched(partial(super().patch_megatron, config), (block_policy, "resolve_chunks", resolve))


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
