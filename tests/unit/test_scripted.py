"""Scripted CoC: every cell of the layout table (docs/DESIGN.md#layouts) against a float64 reference.

Weights are square (in == out), so swapping ``w`` and ``w.T`` cannot go
unnoticed.  Ranks run on the threaded process group.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from coc_impl import scripted
from coc_impl.chunking import CoCChunkFallbackWarning, FallbackNotice, resolve_chunks
from coc_impl.config import CoCConfig
from coc_impl.errors import CoCShapeError
from coc_impl.user_cfgs import UserCfgs
from tests.support.dist_helpers import LinearProblem, record_collectives, run_threaded

S, B, H = 16, 2, 60  # sequence, batch, hidden (in == out); m = S * B = 32


def coc(parallel_num=2, **user_cfgs) -> CoCConfig:
    customized = user_cfgs.pop("customized_coc", {})
    return CoCConfig(
        enabled=True,
        parallel_num=parallel_num,
        user_cfgs=UserCfgs(
            customized_coc={tuple(k): v for k, v in customized.items()}, **user_cfgs
        ),
    )


PROBLEM = LinearProblem.make(S, B, H, H)


def run_layer(rank: int, tp: int, layer: str, sp: bool, config: CoCConfig, problem: LinearProblem,
              dtype: torch.dtype = torch.float64, log=None) -> dict[str, torch.Tensor]:
    """This rank's shards in, the layer forward + backward, this rank's results out."""
    shards = problem.shards(rank, tp, layer, sp)
    forward = scripted.column_forward if layer == "column" else scripted.row_forward
    x, w, b = (t.to(dtype).clone().requires_grad_() for t in (shards.x, shards.w, shards.b))
    y = forward(x, w, b, group=dist.group.WORLD, sequence_parallel=sp, config=config)
    if log is not None:
        log.add(("backward", None))
    y.backward(shards.dy.to(dtype))
    return {"y": y.detach(), "dx": x.grad, "dw": w.grad, "db": b.grad}


def assert_matches(results, tp, layer, sp, problem=PROBLEM, rtol=1e-12, atol=1e-10):
    problem.assert_matches(results, tp, layer, sp, rtol=rtol, atol=atol)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
@pytest.mark.parametrize("tp", [2, 4])
def test_every_cell_matches_fp64_reference(tp: int, layer: str, sp: bool, p: int) -> None:
    results = run_threaded(tp, run_layer, layer, sp, coc(p), PROBLEM)
    assert_matches(results, tp, layer, sp)


@pytest.mark.parametrize("soc", [False, True], ids=["plain", "soc_friendly"])
@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_float32_close_to_fp64(layer: str, sp: bool, soc: bool) -> None:
    results = run_threaded(2, run_layer, layer, sp, coc(4, matmul_soc_friendly=soc), PROBLEM,
                           torch.float32)
    assert_matches(results, 2, layer, sp, rtol=1e-4, atol=1e-4)


def test_soc_friendly_padding() -> None:
    # 60 float64 = 480 B -> padded to 64 (512 B); padding 16 -> 64 would quadruple k.
    assert scripted.soc_friendly_k(60, 8) == 64
    assert scripted.soc_friendly_k(64, 8) == 64
    assert scripted.soc_friendly_k(16, 8) == 16
    assert scripted.soc_friendly_k(1000, 2) == 1024
    g = torch.Generator().manual_seed(3)
    rows, right = torch.randn(7, 60, generator=g), torch.randn(60, 9, generator=g)
    padded = scripted.rows_times(right, soc_friendly=True)(rows)
    torch.testing.assert_close(padded, rows @ right)


# -- customized_coc and the collectives actually issued ---------------------------------------

M = S * B
#: (layer, sp) -> forward / backward matmul shapes (m, k, n) at tp=2 and what they issue
SHAPES = {
    ("column", False): ((M, H, H // 2), None, (M, H // 2, H), "all_reduce"),
    ("column", True): ((M, H, H // 2), "all_gather", (M, H // 2, H), "reduce_scatter"),
    ("row", False): ((M, H // 2, H), "all_reduce", (M, H, H // 2), None),
    ("row", True): ((M, H // 2, H), "reduce_scatter", (M, H, H // 2), "all_gather"),
}


def split_log(events):
    at = events.index(("backward", None))
    return events[:at], events[at + 1:]


def launches(events, kind):
    return sum(1 for name, _ in events if name.startswith(kind))


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_customized_coc_is_honoured_by_every_layer_mode_and_direction(layer: str, sp: bool) -> None:
    fwd_shape, fwd_kind, bwd_shape, bwd_kind = SHAPES[(layer, sp)]
    config = coc(2, customized_coc={fwd_shape: 4, bwd_shape: 8})
    with record_collectives() as log:
        results = run_threaded(2, run_layer, layer, sp, config, PROBLEM, torch.float64, log)
    assert_matches(results, 2, layer, sp)
    for rank in range(2):
        forward, backward = split_log(log.events[rank])
        if fwd_kind:
            assert launches(forward, fwd_kind) == 4, forward
        assert len([e for e in forward if e[0] != "wait"]) == (4 if fwd_kind else 0)
        if bwd_kind:
            assert launches(backward, bwd_kind) == 8, backward


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_parallel_num_applies_to_shapes_not_customized(layer: str, sp: bool) -> None:
    config = coc(2, customized_coc={(M + 1, H, H): 8})
    with record_collectives() as log:
        run_threaded(2, run_layer, layer, sp, config, PROBLEM, torch.float64, log)
    fwd_shape, fwd_kind, bwd_shape, bwd_kind = SHAPES[(layer, sp)]
    forward, backward = split_log(log.events[0])
    assert launches(forward, fwd_kind) == 2 if fwd_kind else not forward
    if bwd_kind:
        assert launches(backward, bwd_kind) == 2


def test_customized_one_switches_a_shape_off() -> None:
    fwd_shape = SHAPES[("row", False)][0]
    with record_collectives() as log:
        run_threaded(2, run_layer, "row", False, coc(8, customized_coc={fwd_shape: 1}), PROBLEM,
                     torch.float64, log)
    forward, _ = split_log(log.events[0])
    assert launches(forward, "all_reduce") == 1


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "saved"])
@pytest.mark.parametrize("tp", [2, 4])
def test_recompute_all_gather_both_ways(tp: int, recompute: bool) -> None:
    config = coc(4, recompute_all_gather=recompute)
    with record_collectives() as log:
        results = run_threaded(tp, run_layer, "column", True, config, PROBLEM, torch.float64, log)
    assert_matches(results, tp, "column", True)
    for rank in range(tp):
        _, backward = split_log(log.events[rank])
        assert launches(backward, "all_gather") == (1 if recompute else 0)
        assert launches(backward, "reduce_scatter") == 4


# -- gradient accumulation fusion ------------------------------------------------------------


def fused_accumulation(rank: int, tp: int, layer: str, sp: bool, flag: str | None):
    shards = PROBLEM.shards(rank, tp, layer, sp)
    forward = scripted.column_forward if layer == "column" else scripted.row_forward
    w = shards.w.clone().requires_grad_()
    w.main_grad = torch.ones(w.shape, dtype=torch.float32)
    if flag is not None:
        w.grad_added_to_main_grad = False
        w.zero_out_wgrad = flag == "zero"
    y = forward(shards.x, w, None, group=dist.group.WORLD, sequence_parallel=sp, config=coc(2),
                gradient_accumulation_fusion=True)
    y.backward(shards.dy)
    return w.main_grad, w.grad, getattr(w, "grad_added_to_main_grad", None)


@pytest.mark.parametrize("flag", [None, "zero", "empty"])
@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_gradient_accumulation_fusion_into_main_grad(layer: str, sp: bool, flag: str | None) -> None:
    for rank, (main_grad, grad, added) in enumerate(run_threaded(2, fused_accumulation, layer, sp, flag)):
        want = PROBLEM.expected(rank, 2, layer, sp)["dw"]
        assert main_grad.dtype == torch.float32
        torch.testing.assert_close(main_grad.double(), want + 1, rtol=1e-5, atol=1e-5)
        if flag is None:
            assert grad is None
        else:
            assert added is True and grad is not None and grad.shape == want.shape
            if flag == "zero":
                assert not grad.any()


# -- shape rules ----------------------------------------------------------------------------


def shape_error(rank: int, tp: int, layer: str, sp: bool, p: int, problem: LinearProblem) -> str:
    with pytest.raises(CoCShapeError) as info:
        run_layer(rank, tp, layer, sp, coc(p), problem)
    return str(info.value)


@pytest.mark.parametrize(
    "layer, sp, s, p, words",
    [
        ("row", False, 15, 4, ["m=30", "p=4", "tp=2", "RowParallelLinear forward"]),
        ("row", True, 6, 4, ["m=12", "p=4", "tp=2", "rows per rank", "RowParallelLinear"]),
        ("column", True, 3, 4, ["m=12", "p=4", "tp=2", "ColumnParallelLinear forward"]),
        ("column", False, 15, 4, ["m=30", "p=4", "tp=2", "ColumnParallelLinear backward"]),
    ],
)
def test_indivisible_rows_raise_on_every_rank_before_any_collective(layer, sp, s, p, words) -> None:
    problem = LinearProblem.make(s * 2 if layer == "column" and sp else s, B, H, H)
    with record_collectives() as log:
        messages = run_threaded(2, shape_error, layer, sp, p, problem)
    for message in messages:
        for word in words:
            assert word in message
    if layer == "row" or sp:  # the column no-SP forward has no collective to guard
        assert not any(log.launches(rank) for rank in range(2))


def backward_shape_error(rank: int, tp: int, config: CoCConfig, problem: LinearProblem, log) -> str:
    with pytest.raises(CoCShapeError) as info:
        run_layer(rank, tp, "column", True, config, problem, torch.float64, log)
    return str(info.value)


def test_column_sp_backward_checks_before_regathering_x() -> None:
    """A backward-only shape error (customized chunk count) stops before the x re-gather."""
    problem = LinearProblem.make(6, B, H, H)  # m = 12, 6 rows per rank
    config = coc(2, customized_coc={(12, H // 2, H): 4})
    with record_collectives() as log:
        messages = run_threaded(2, backward_shape_error, config, problem, log)
    assert all("ColumnParallelLinear backward" in message for message in messages)
    for rank in range(2):
        forward, backward = split_log(log.events[rank])
        assert launches(forward, "all_gather") == 2 and not backward


@pytest.mark.parametrize("sp", [False, True], ids=["no_sp", "sp"])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_fewer_rows_than_chunks_falls_back_with_one_warning_per_call(layer: str, sp: bool) -> None:
    small = LinearProblem.make(2, B, H, H)  # m = 4 < p = 8
    with warnings.catch_warnings(record=True) as caught, record_collectives() as log:
        warnings.simplefilter("always")
        results = run_threaded(2, run_layer, layer, sp, coc(8), small, torch.float64, log)
    small.assert_matches(results, 2, layer, sp, rtol=1e-12, atol=1e-10)
    fallbacks = [w for w in caught if w.category is CoCChunkFallbackWarning]
    assert len(fallbacks) == 2, [str(w.message) for w in fallbacks]  # one per rank
    for rank in range(2):  # unchunked: one collective per direction that has one
        launches = log.launches(rank)
        assert launches and all(rows != 0 for _, rows in launches), launches
        assert len(log.launches(rank)) == {("column", False): 1, ("column", True): 3,
                                           ("row", False): 1, ("row", True): 2}[(layer, sp)]


# -- chunk resolution (pure) ----------------------------------------------------------------


def resolve(config: CoCConfig, m: int, sp: bool = False, tp: int = 2, k: int = 8, n: int = 8) -> int:
    return resolve_chunks(config, m=m, k=k, n=n, tp=tp, layer="TestLayer forward", sequence_parallel=sp)


def test_resolve_order_and_defaults() -> None:
    assert resolve(CoCConfig(), 64) == 1  # disabled
    assert resolve(coc(4), 64) == 4
    assert resolve(coc(4, customized_coc={(64, 8, 8): 8}), 64) == 8
    assert resolve(coc(4, customized_coc={(64, 8, 8): 1}), 64) == 1
    assert resolve(coc("auto"), 64) == 1  # nothing to measure with: no CoC
    assert resolve_chunks(coc("auto"), m=64, k=8, n=8, tp=2, layer="x", sequence_parallel=False,
                          auto=lambda: 4) == 4


def test_resolve_fallback_warns_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve(coc(8), 4) == 1
    assert [w.category for w in caught] == [CoCChunkFallbackWarning]
    assert "m=4" in str(caught[0].message) and "TestLayer" in str(caught[0].message)


def test_a_notice_keeps_one_call_to_one_warning() -> None:
    notice = FallbackNotice()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # e.g. the forward and backward matmuls of one layer call
            assert resolve_chunks(coc(8), m=4, k=8, n=8, tp=2, layer="L", sequence_parallel=False,
                                  notice=notice) == 1
    assert len(caught) == 1 and notice.given


@pytest.mark.parametrize(
    "m, sp, tp, match",
    [(30, False, 2, "multiple of the chunk count"), (34, True, 2, "multiple of the chunk count"),
     (40, True, 3, "not a multiple of tp"), (24, True, 4, "rows per rank")],
)
def test_resolve_shape_errors(m: int, sp: bool, tp: int, match: str) -> None:
    with pytest.raises(CoCShapeError, match=match) as info:
        resolve(coc(4), m, sp=sp, tp=tp)
    assert f"m={m}" in str(info.value) and "p=4" in str(info.value) and f"tp={tp}" in str(info.value)


def _auto_row_layer_on_npus(rank: int, world: int) -> int:
    """A row-parallel layer with ``parallel_num auto`` on this emulated NPU rank's device: the chunk count it
    measured, its forward and backward run over the hccl group."""
    from coc_impl import autotune

    x = torch.randn(32, 2, 16, device="npu", requires_grad=True)
    w = torch.randn(24, 16, device="npu", requires_grad=True)
    y = scripted.row_forward(x, w, None, group=dist.group.WORLD, sequence_parallel=True, config=coc("auto"))
    y.sum().backward()
    return len(autotune._decisions)


def test_parallel_num_auto_measures_on_the_layers_device(tmp_path) -> None:
    """``parallel_num auto`` times its candidates with the layer's own tensors' device and group: on an NPU the
    group is HCCL, which takes no CPU tensor (measuring on the CPU failed "No backend type associated with device
    type cpu" on the emulated NPU node)."""
    from npu_sim.testing import run_ranks

    assert run_ranks(_auto_row_layer_on_npus, 2, tmp_path, timeout=120) == [2, 2]  # forward and backward sites
