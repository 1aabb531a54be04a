"""``patch_megatron``: real megatron layers routed through CoC, and put back.

Patched layers must agree with the unpatched megatron layers and with the
float64 reference, forward and backward, keep megatron's call conventions,
and actually issue the chunked collectives.  Under ``--coc-fused-kernel`` the
same holds with the portable tiling plan in place of equal chunks.
"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from coc_impl import scripted
from coc_impl.backends import portable
from coc_impl.config import CoCConfig
from coc_impl.errors import CoCBackendUnavailable
from coc_impl.megatron_patch import backend_for, patch_megatron
from coc_impl.user_cfgs import UserCfgs
from coc_shared import megatron as adapter
from coc_shared.megatron import ColumnParallelLinear, RowParallelLinear
from tests.support.dist_helpers import LinearProblem, record_collectives

S, B, H = 16, 2, 16  # m = 32; square weights
PROBLEM = LinearProblem.make(S, B, H, H, seed=11)
FP32 = dict(rtol=1e-5, atol=1e-5)
CHUNKS = (1, 2, 4, 8)


def coc(parallel_num: int = 2, **kwargs) -> CoCConfig:
    return CoCConfig(enabled=True, parallel_num=parallel_num, **kwargs)


def build(layer: str, sp: bool, problem: LinearProblem = PROBLEM, **options):
    maker = adapter.build_column if layer == "column" else adapter.build_row
    h_out, h_in = problem.w.shape
    return maker(h_in, h_out, sequence_parallel=sp, weight=problem.w.float(),
                 bias_value=problem.b.float(), **options)


def forward_backward(module, shards) -> dict[str, torch.Tensor]:
    x = shards.x.float().clone().requires_grad_()
    y, _ = module(x)
    y.backward(shards.dy.float())
    return {"y": y.detach(), "dx": x.grad, "dw": module.weight.grad, "db": module.bias.grad}


def patched_vs_unpatched(rank: int, tp: int, layer: str, sp: bool):
    """For every chunk count: (unpatched, patched, collectives the patched run issued)."""
    shards = PROBLEM.shards(rank, tp, layer, sp)
    out = {}
    with adapter.model_parallel(tp, sequence_parallel=sp):
        for p in CHUNKS:
            unpatched = forward_backward(build(layer, sp), shards)
            module = build(layer, sp)
            with record_collectives() as log, patch_megatron(coc(p)):
                patched = forward_backward(module, shards)
            out[p] = (unpatched, patched, len(log.launches(rank)))
    return out


#: collectives the CoC path issues for chunk count p (forward + backward)
COLLECTIVES = {
    ("column", False): lambda p: p,  # dx all-reduce
    ("column", True): lambda p: p + 1 + p,  # x gather, x re-gather, dx reduce-scatter
    ("row", False): lambda p: p,  # y all-reduce
    ("row", True): lambda p: p + p,  # y reduce-scatter, dy gather
}


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
@pytest.mark.parametrize("tp", [2, 4])
def test_patched_layers_match_megatron_and_reference(pools, tp: int, layer: str, sp: bool) -> None:
    results = pools(tp).run(patched_vs_unpatched, layer, sp)
    for p in CHUNKS:
        unpatched = [per_rank[p][0] for per_rank in results]
        patched = [per_rank[p][1] for per_rank in results]
        PROBLEM.assert_matches(unpatched, tp, layer, sp, what="megatron", **FP32)
        PROBLEM.assert_matches(patched, tp, layer, sp, what=f"patched p={p}", **FP32)
        for rank, (before, after) in enumerate(zip(unpatched, patched, strict=True)):
            for name in before:
                if p == 1:  # chunk count 1: megatron's own serial path, bit for bit
                    assert torch.equal(before[name], after[name]), (rank, name)
                else:
                    torch.testing.assert_close(after[name], before[name], **FP32)
        if p > 1:
            issued = {per_rank[p][2] for per_rank in results}
            assert issued == {COLLECTIVES[(layer, sp)](p)}, f"p={p}: {issued}"


def call_conventions(rank: int, tp: int) -> dict[str, object]:
    """Megatron's options, patched vs unpatched, on the same inputs."""
    x = PROBLEM.x.float()
    x_row = PROBLEM.shards(rank, tp, "row", False).x.float()
    results: dict[str, object] = {}
    with adapter.model_parallel(tp):
        cases = {
            "column skip_bias_add": (lambda: build("column", False, skip_bias_add=True), lambda m: m(x)),
            "column gather_output": (lambda: build("column", False, gather_output=True), lambda m: m(x)),
            **({"column runtime_gather_output": (
                lambda: build("column", False), lambda m: m(x, runtime_gather_output=True))}
               if adapter.COLUMN_HAS_RUNTIME_GATHER_OUTPUT else {}),
            "column weight override": (
                lambda: build("column", False), lambda m: m(x, weight=m.weight.detach() * 2)),
            "row skip_bias_add": (lambda: build("row", False, skip_bias_add=True), lambda m: m(x_row)),
            "row input_is_parallel=False": (
                lambda: build("row", False, input_is_parallel=False), lambda m: m(x)),
        }
        for name, (make, call) in cases.items():
            expected = call(make())
            with patch_megatron(coc(4)):
                got = call(make())
            results[name] = tuple(
                tuple(t.detach() if t is not None else None for t in pair) for pair in (expected, got)
            )
        with patch_megatron(coc(4)):
            module = build("column", False)
            try:
                module(x, weight=torch.zeros(H, H))
            except RuntimeError as exc:
                results["bad weight"] = str(exc)
    return results


def test_megatron_call_conventions_are_kept(pools) -> None:
    for per_rank in pools(2).run(call_conventions):
        assert "supplied weight's shape is (16, 16), not (8, 16)" in per_rank.pop("bad weight")
        for name, ((want_out, want_bias), (got_out, got_bias)) in per_rank.items():
            torch.testing.assert_close(got_out, want_out, **FP32, msg=lambda m, name=name: f"{name}: {m}")
            assert (got_bias is None) == (want_bias is None), name
            if want_bias is not None:
                assert torch.equal(got_bias, want_bias), name


def accumulation_and_frozen(rank: int, tp: int, sp: bool):
    shards = PROBLEM.shards(rank, tp, "column", sp)
    with adapter.model_parallel(tp, sequence_parallel=sp):
        fused = build("column", sp, gradient_accumulation_fusion=True)
        fused.weight.main_grad = torch.zeros(fused.weight.shape, dtype=torch.float32)
        frozen = build("column", sp)
        frozen.weight.requires_grad_(False)
        with patch_megatron(coc(2)):
            forward_backward(fused, shards)
            x = shards.x.float().clone().requires_grad_()
            frozen(x)[0].backward(shards.dy.float())
        return fused.weight.main_grad, fused.weight.grad, x.grad, frozen.weight.grad


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
def test_gradient_accumulation_fusion_and_frozen_weights(pools, sp: bool) -> None:
    for rank, (main_grad, grad, dx, frozen_grad) in enumerate(pools(2).run(accumulation_and_frozen, sp)):
        want = PROBLEM.expected(rank, 2, "column", sp)
        torch.testing.assert_close(main_grad.double(), want["dw"], **FP32)
        assert grad is None and frozen_grad is None
        torch.testing.assert_close(dx.double(), want["dx"], **FP32)


def through_fake_fused(rank: int, tp: int):
    """``fused_kernel=True`` dispatches to ``coc_impl.fused`` (here a recording stand-in)."""
    calls: list[str] = []

    def recording(name, forward):
        def call(*args, **kwargs):
            calls.append(name)
            return forward(*args, **kwargs)
        return call

    fake = types.ModuleType("coc_impl.fused")
    fake.column_forward = recording("column", scripted.column_forward)
    fake.row_forward = recording("row", scripted.row_forward)
    real = sys.modules.get("coc_impl.fused")
    sys.modules["coc_impl.fused"] = fake
    try:
        with adapter.model_parallel(tp):
            column, row = build("column", False), build("row", False)
            with patch_megatron(CoCConfig(enabled=True, fused_kernel=True)):
                y = column(PROBLEM.x.float())[0]
                z = row(PROBLEM.shards(rank, tp, "row", False).x.float())[0]
        return calls, y.detach(), z.detach()
    finally:
        if real is None:
            del sys.modules["coc_impl.fused"]
        else:
            sys.modules["coc_impl.fused"] = real


def test_fused_flag_dispatches_to_the_fused_module(pools) -> None:
    for rank, (calls, y, z) in enumerate(pools(2).run(through_fake_fused)):
        assert calls == ["column", "row"]
        torch.testing.assert_close(y.double(), PROBLEM.expected(rank, 2, "column", False)["y"], **FP32)
        torch.testing.assert_close(z.double(), PROBLEM.y, **FP32)


# -- the fused kernel's layers ---------------------------------------------------------------

#: m = 1200 tokens: the default plan tiles every pipelined matmul into several unequal blocks
#: (e.g. 384, 384, 384, 48 without SP) at TP 2 and 4.
FUSED = LinearProblem.make(600, 2, H, H, seed=12)
FUSED_FP32 = dict(rtol=1e-5, atol=1e-4)  # the weight gradient sums 1200 fp32 products


def fused(**user_cfgs) -> CoCConfig:
    return CoCConfig(enabled=True, fused_kernel=True, user_cfgs=UserCfgs(**user_cfgs))


def fused_vs_unpatched(rank: int, tp: int, layer: str, sp: bool, user_cfgs: dict):
    """Unpatched and fused results, collectives issued per kind, and the plan's block count.

    The plan is the one of the column dx matmul and of the row forward
    (the same ``[m, H/tp] @ [H/tp, H]`` tiling for square weights).
    """
    shards = FUSED.shards(rank, tp, layer, sp)
    m = FUSED.x.shape[:-1].numel()
    split, factor = (m // tp, tp) if sp else (m, 1)
    planned = len(portable.plan(split, factor, H // tp, H, 4))
    with adapter.model_parallel(tp, sequence_parallel=sp):
        unpatched = forward_backward(build(layer, sp, FUSED), shards)
        module = build(layer, sp, FUSED)
        with record_collectives() as log, patch_megatron(fused(**user_cfgs)):
            patched = forward_backward(module, shards)
    issued = {
        kind: (len(log.launches(rank, kind)),
               sum(1 for e in log.events[rank] if e[0] == "wait" and e[1].startswith(kind)))
        for kind in ("all_reduce", "reduce_scatter", "all_gather")
    }
    return unpatched, patched, issued, planned


def assert_fused_matches(results, tp: int, layer: str, sp: bool) -> None:
    FUSED.assert_matches([r[1] for r in results], tp, layer, sp, what="fused", **FUSED_FP32)
    for rank, (unpatched, patched, *_) in enumerate(results):
        for name in unpatched:
            torch.testing.assert_close(patched[name], unpatched[name], **FUSED_FP32,
                                       msg=lambda m, r=rank, n=name: f"rank {r} {n}: {m}")


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
@pytest.mark.parametrize("tp", [2, 4])
def test_fused_layers_match_megatron(pools, tp: int, layer: str, sp: bool) -> None:
    results = pools(tp).run(fused_vs_unpatched, layer, sp, {})
    assert_fused_matches(results, tp, layer, sp)
    reduction = "reduce_scatter" if sp else "all_reduce"
    for _, _, issued, planned in results:
        if layer == "row":  # the forward runs the plan's blocks, all asynchronous
            assert planned > 1 and issued[reduction] == (planned, planned), issued
        else:  # the dx collective stays one block by default
            assert issued[reduction] == (1, 1), issued


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("tp", [2, 4])
def test_fused_column_backward_pipelines_dx_on_request(pools, tp: int, sp: bool) -> None:
    results = pools(tp).run(fused_vs_unpatched, "column", sp, {"enable_coc_in_column_backward": True})
    assert_fused_matches(results, tp, "column", sp)
    dx_collective = "reduce_scatter" if sp else "all_reduce"
    for _, _, issued, planned in results:
        assert planned > 1 and issued[dx_collective] == (planned, planned), issued


@pytest.mark.parametrize("tp", [2, 4])
def test_fused_column_sp_saves_the_gather_without_recompute(pools, tp: int) -> None:
    """``recompute_all_gather=False`` in the fused column SP path (docs/DESIGN.md#known-upstream-defects)."""
    saved = pools(tp).run(fused_vs_unpatched, "column", True, {"recompute_all_gather": False})
    assert_fused_matches(saved, tp, "column", True)
    recomputed = pools(tp).run(fused_vs_unpatched, "column", True, {})
    for with_save, with_recompute in zip(saved, recomputed, strict=True):
        gathers_saved, gathers_recomputed = with_save[2]["all_gather"][0], with_recompute[2]["all_gather"][0]
        assert gathers_saved > 1 and gathers_recomputed == gathers_saved + 1


# -- patching itself (no ranks needed) -----------------------------------------------------


def originals():
    return ColumnParallelLinear.__dict__["forward"], RowParallelLinear.__dict__["forward"]


def test_patch_replaces_keeps_signatures_and_restores() -> None:
    before = originals()
    signatures = [inspect.signature(f) for f in before]
    with patch_megatron(coc(2)):
        inside = originals()
        assert all(a is not b for a, b in zip(inside, before, strict=True))
        assert [inspect.signature(f) for f in inside] == signatures
        assert [f.__name__ for f in inside] == ["forward", "forward"]
    assert originals() == before


def test_patch_is_restored_when_the_block_raises() -> None:
    before = originals()
    with pytest.raises(ZeroDivisionError), patch_megatron(coc(2)):
        raise ZeroDivisionError
    assert originals() == before


@pytest.mark.parametrize(
    "config", [CoCConfig(), coc(1), CoCConfig(enabled=False, parallel_num=4)],
    ids=["default", "parallel_num_1", "disabled"],
)
def test_serial_configs_leave_megatron_untouched(config: CoCConfig) -> None:
    before = originals()
    assert backend_for(config) is None
    with patch_megatron(config):
        assert originals() == before


def test_scripted_dispatch() -> None:
    assert backend_for(coc(2)) is scripted
    assert backend_for(coc(8, user_cfgs=UserCfgs(customized_coc={(1, 2, 3): 2}))) is scripted


def test_missing_fused_backend_raises_before_patching(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "coc_impl.fused", None)  # import fails
    before = originals()
    with pytest.raises(CoCBackendUnavailable, match="coc-fused-kernel"), patch_megatron(
        CoCConfig(enabled=True, fused_kernel=True)
    ):
        pytest.fail("entered the block")
    assert originals() == before


def test_incomplete_fused_backend_is_unavailable(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "coc_impl.fused", types.ModuleType("coc_impl.fused"))
    with pytest.raises(CoCBackendUnavailable, match="column_forward, row_forward"):
        backend_for(CoCConfig(enabled=True, fused_kernel=True))


def _layer_stub(**attrs):
    """The attributes the patch reads to decide whether CoC covers a layer (a TP 2 layer CoC covers)."""
    config = types.SimpleNamespace(defer_embedding_wgrad_compute=False, _cpu_offloading_context=None)
    group = types.SimpleNamespace(size=lambda: 2)
    fields = dict(allreduce_dgrad=True, sequence_parallel=False, explicit_expert_comm=False, config=config,
                  tp_group=group)
    return types.SimpleNamespace(**{**fields, **attrs})


def test_weights_sharded_beyond_tp_stay_megatrons() -> None:
    """0.19's weight rematerialisation (``gtp_remat_size`` > 1): megatron gathers the weight itself."""
    from coc_impl import megatron_patch

    for uses_coc in (megatron_patch._column_uses_coc, megatron_patch._row_uses_coc):
        assert uses_coc(_layer_stub())
        assert uses_coc(_layer_stub(gtp_remat_size=1))
        assert not uses_coc(_layer_stub(gtp_remat_size=2))
