"""The megatron CPU adapter: real megatron TP layers on gloo ranks, unpatched.

Megatron's ``parallel_state`` is process-global, so these ranks are real gloo
processes (forked, reused across tests), not threads.
"""

from __future__ import annotations

import pytest
import torch

from coc_shared import megatron as adapter
from tests.support.dist_helpers import LinearProblem

S, B, H = 8, 2, 16  # square weights: a transposed shard cannot pass
PROBLEM = LinearProblem.make(S, B, H, H, seed=7)
FP32 = dict(rtol=1e-5, atol=1e-5)


def build(layer: str, sp: bool, problem: LinearProblem, **options):
    maker = adapter.build_column if layer == "column" else adapter.build_row
    return maker(H, H, sequence_parallel=sp, weight=problem.w.float(), bias_value=problem.b.float(),
                 **options)


def forward_backward(module, shards, *, row_full_input: bool = False) -> dict[str, torch.Tensor]:
    x = shards.x.float().clone().requires_grad_()
    y, output_bias = module(x)
    assert output_bias is None
    y.backward(shards.dy.float())
    return {"y": y.detach(), "dx": x.grad, "dw": module.weight.grad, "db": module.bias.grad}


def unpatched_layer(rank: int, tp: int, layer: str, sp: bool) -> dict[str, torch.Tensor]:
    with adapter.model_parallel(tp, sequence_parallel=sp) as tpc:
        assert (tpc.size, tpc.rank, tpc.sequence_parallel) == (tp, rank, sp)
        module = build(layer, sp, PROBLEM)
        return forward_backward(module, PROBLEM.shards(rank, tp, layer, sp))


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
@pytest.mark.parametrize("tp", [2, 4])
def test_unpatched_megatron_matches_fp64_reference(pools, tp: int, layer: str, sp: bool) -> None:
    results = pools(tp).run(unpatched_layer, layer, sp)
    PROBLEM.assert_matches(results, tp, layer, sp, what="megatron", **FP32)


def loaded_shards(rank: int, tp: int) -> tuple[torch.Tensor, ...]:
    with adapter.model_parallel(tp):
        column, row = build("column", False, PROBLEM), build("row", False, PROBLEM)
        return column.weight.detach(), column.bias.detach(), row.weight.detach(), row.bias.detach()


def test_global_weights_are_sharded_like_megatron(pools) -> None:
    for rank, (cw, cb, rw, rb) in enumerate(pools(2).run(loaded_shards)):
        own = slice(rank * H // 2, (rank + 1) * H // 2)
        assert torch.equal(cw, PROBLEM.w[own].float()) and torch.equal(cb, PROBLEM.b[own].float())
        assert torch.equal(rw, PROBLEM.w[:, own].float()) and torch.equal(rb, PROBLEM.b.float())


def gather_and_scatter_options(rank: int, tp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column ``gather_output=True`` and Row ``input_is_parallel=False`` use megatron's mappings."""
    with adapter.model_parallel(tp):
        column = build("column", False, PROBLEM, gather_output=True)
        row = build("row", False, PROBLEM, input_is_parallel=False)
        return column(PROBLEM.x.float())[0].detach(), row(PROBLEM.x.float())[0].detach()


def test_mapping_paths_run_on_cpu(pools) -> None:
    for gathered, row_out in pools(2).run(gather_and_scatter_options):
        torch.testing.assert_close(gathered.double(), PROBLEM.y, **FP32)
        torch.testing.assert_close(row_out.double(), PROBLEM.y, **FP32)


def state_after_exit(rank: int, tp: int) -> tuple[bool, bool, bool, bool]:
    from megatron.core import parallel_state

    with adapter.model_parallel(tp):
        group = parallel_state.get_tensor_model_parallel_group()
    kept = parallel_state.model_parallel_is_initialized()
    with adapter.model_parallel(tp, keep=False):
        reused = parallel_state.get_tensor_model_parallel_group() is group
    released = parallel_state.model_parallel_is_initialized()
    with adapter.model_parallel(tp):
        pass
    adapter.release_model_parallel()
    return kept, reused, released, parallel_state.model_parallel_is_initialized()


def test_model_parallel_is_kept_for_the_next_block_and_released_on_request(pools) -> None:
    """The state stays for the next case of the same size (its groups are reused); keep=False releases it."""
    assert pools(2).run(state_after_exit) == [(True, True, False, False)] * 2


def alternating_sizes(rank: int, world: int) -> list[tuple[int, int, bool, int, bool]]:
    """Blocks at TP ``world`` and TP 1 in turn, then a release and one more block: per block its TP and DP
    sizes, whether its TP group is the one its size had before, the process groups created so far, and whether
    megatron's mappings over its group give the right numbers."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    adapter.release_model_parallel()
    real, created = dist.new_group, []

    def counted(*args, **kwargs):
        created.append(real(*args, **kwargs))
        return created[-1]

    seen: dict[int, object] = {}
    blocks = []
    dist.new_group = counted
    try:
        for tp in (world, 1, world, 1, "release", world):
            if tp == "release":
                adapter.release_model_parallel()
                assert not any(group in dist.distributed_c10d._world.pg_map for group in created)
                seen.clear()
                continue
            with adapter.model_parallel(tp) as par:
                kept = seen.setdefault(tp, par.group) is par.group
                column = build("column", False, PROBLEM, gather_output=True)
                right = torch.allclose(column(PROBLEM.x.float())[0].double(), PROBLEM.y, **FP32)
                blocks.append((par.size, parallel_state.get_data_parallel_world_size(), kept, len(created), right))
    finally:
        dist.new_group = real
        adapter.release_model_parallel()
    return blocks


def test_each_tp_size_is_set_up_once_and_switched_back_to(pools) -> None:
    """Cases of a pool alternate between TP sizes: each size's groups are set up once and put back, not made again
    (each set-up is a dozen collective group creations); a release destroys every size's groups."""
    for blocks in pools(2).run(alternating_sizes):
        assert [b[:3] for b in blocks] == [(2, 1, True), (1, 2, True), (2, 1, True), (1, 2, True), (2, 1, True)]
        assert all(right for *_, right in blocks), blocks
        made = [b[3] for b in blocks]
        assert 0 < made[0] < made[1] == made[2] == made[3] < made[4], made  # none made when switching back


def a_size_left_behind(rank: int, world: int) -> list[bool]:
    """Whether TP ``world``'s group still lives after each block at TP 1 that follows it."""
    import torch.distributed as dist

    from coc_shared.megatron import parallel

    adapter.release_model_parallel()
    with adapter.model_parallel(world) as par:
        group = par.group
    alive = []
    for _ in range(parallel.KEEP_BLOCKS + 1):
        with adapter.model_parallel(1):
            alive.append(group in dist.distributed_c10d._world.pg_map)
    adapter.release_model_parallel()
    return alive


def test_a_size_no_block_uses_any_more_is_released(pools) -> None:
    """Idle gloo groups cost CPU: a size unused for KEEP_BLOCKS blocks is destroyed, on every rank alike."""
    from coc_shared.megatron.parallel import KEEP_BLOCKS

    assert pools(2).run(a_size_left_behind) == [[True] * KEEP_BLOCKS + [False]] * 2


def leaving_and_last_join(rank: int, tp: int) -> tuple[float, float]:
    """When this rank left ``model_parallel``'s set-up, and when it finished joining its groups, the last
    group's join made slow on rank 1 (as a loaded rank is while gloo takes its peers' connections)."""
    import time

    import torch.distributed as dist

    from coc_shared.megatron import parallel

    adapter.release_model_parallel()
    with adapter.model_parallel(tp):
        count = len(parallel._kept[tp, tp].groups)
    adapter.release_model_parallel()
    real, joined = dist.new_group, []

    def slow_last(*args, **kwargs):
        group = real(*args, **kwargs)
        if rank == 1 and len(joined) == count - 1:
            time.sleep(0.3)
        joined.append(time.monotonic())
        return group

    dist.new_group = slow_last
    try:
        with adapter.model_parallel(tp):
            left = time.monotonic()
    finally:
        dist.new_group = real
        adapter.release_model_parallel()
    return left, joined[-1]


def test_no_rank_leaves_the_set_up_before_every_rank_joined_every_group(pools) -> None:
    """A group a rank destroys while a peer still joins it fails the peer ("Connection closed by peer")."""
    (left_0, _), (_, joined_1) = pools(2).run(leaving_and_last_join)
    assert left_0 >= joined_1, f"rank 0 left {joined_1 - left_0:.3f} s before rank 1 had joined its last group"


def sp_without_redirect(rank: int, tp: int) -> str:
    """What the redirect is for: megatron's SP buffers ask ``torch.cuda`` for a device."""
    from megatron.core import parallel_state

    adapter.release_model_parallel()
    parallel_state.initialize_model_parallel(tp)
    try:
        module = build("column", True, PROBLEM)
        try:
            module(PROBLEM.shards(rank, tp, "column", True).x.float())
        except (AssertionError, RuntimeError) as exc:
            return str(exc)
        return "no error"
    finally:
        parallel_state.destroy_model_parallel()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the redirect is only active without CUDA")
def test_megatron_needs_the_redirect_on_cpu(pools) -> None:
    assert all("CUDA" in message for message in pools(2).run(sp_without_redirect))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the redirect is only active without CUDA")
def test_cpu_device_redirect_is_scoped_and_restored() -> None:
    original = torch.cuda.current_device
    with adapter.cpu_device_redirect():
        with adapter.cpu_device_redirect():  # noqa: SIM117 - nesting is what is tested
            assert torch.cuda.current_device() == torch.device("cpu")
        assert torch.cuda.current_device() == torch.device("cpu")  # outer still active
    assert torch.cuda.current_device is original
    with pytest.raises(KeyError), adapter.cpu_device_redirect():
        raise KeyError("boom")
    assert torch.cuda.current_device is original


def test_model_parallel_needs_an_initialised_group() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"), adapter.model_parallel(2):
        pass


def test_build_options_are_applied(pools) -> None:
    assert pools(2).run(build_options) == [(True, True, False)] * 2


def build_options(rank: int, tp: int) -> tuple[bool, bool, bool]:
    with adapter.model_parallel(tp):
        column = adapter.build_column(H, H, gradient_accumulation_fusion=True, skip_bias_add=True)
        row = adapter.build_row(H, H, bias=False)
        return column.gradient_accumulation_fusion, column.skip_bias_add, row.bias is not None
