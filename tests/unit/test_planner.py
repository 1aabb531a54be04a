"""The MC2 tiling planner: the MC2 method's worked example, hand cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coc_impl.errors import CoCShapeError
from coc_impl.planner import (
    Plan,
    plan_blocks,
    short_block_candidates,
    short_block_rows,
)
from coc_shared.cost_curves import LinearCost, PiecewiseQuadLinearCost
from coc_shared.cost_model import SEED_COSTS_FILE, CommCost, MatmulCost, load_costs


@pytest.fixture(scope="module")
def seed_costs():
    return load_costs(SEED_COSTS_FILE).bind(3072, 8192, 2)


def test_short_block_candidates_of_seed_example():
    # a*K*N >= 4 GiB -> 171; b*K*N/1024 + b*N >= 6 MiB -> 192; c = 384.
    assert short_block_candidates(3072, 8192) == (171, 192, 384)
    # The seed's example uses 384: every candidate is a lower bound, take the max.
    assert short_block_rows(3072, 8192) == 384
    # Small K*N makes the FLOP bound dominate.
    assert short_block_candidates(1024, 1024) == (4096, 3072, 384)
    assert short_block_rows(1024, 1024) == 4096


def test_seed_worked_example(seed_costs):
    mm, comm = seed_costs
    plan = plan_blocks(4096, 3072, 8192, 2, mm, comm)
    assert plan == Plan(blocks=(512, 896, 896, 896, 896), bound="comm", m0=512, m1=896, count=4)


def test_inflation_changes_the_seed_plan(seed_costs):
    # Without inflation t1 = CostComm(384) = 142.2 us -> m1 = 725 -> 640, count 5.
    mm, comm = seed_costs
    plan = plan_blocks(4096, 3072, 8192, 2, mm, comm, inflation=1.0)
    assert plan.blocks == (896, 640, 640, 640, 640, 640)


def test_compute_bound_puts_short_block_last():
    # 1 us per row of matmul, comm 32 us/MB = 0.5 us per row of 8192 fp16.
    mm = MatmulCost(LinearCost(1.0, 0.0), 8192, 8192)
    comm = CommCost(LinearCost(32.0, 0.0), 8192, 2)
    plan = plan_blocks(4096, 8192, 8192, 2, mm, comm)
    # m0 = 384, t0 = 441.6 -> m1 = 883 -> 768; count 4; m1 = 896; m0 = 512.
    assert plan == Plan(blocks=(896, 896, 896, 896, 512), bound="compute", m0=512, m1=896, count=4)


def test_degenerate_plans_are_one_block(seed_costs):
    mm, comm = seed_costs
    assert plan_blocks(384, 3072, 8192, 2, mm, comm) == Plan((384,), "comm", 384, 0, 0)
    assert plan_blocks(300, 3072, 8192, 2, mm, comm).blocks == (300,)
    # 384 + one long block of 768 does not fit in 1000 rows.
    assert plan_blocks(1000, 3072, 8192, 2, mm, comm).blocks == (1000,)
    assert plan_blocks(1152, 3072, 8192, 2, mm, comm).blocks == (384, 768)
    # A matmul so cheap that no long block reaches the short block's comm time.
    flat = MatmulCost(LinearCost(0.0, 1.0), 3072, 8192)
    assert plan_blocks(8192, 3072, 8192, 2, flat, comm).blocks == (8192,)


def test_costs_bound_to_another_shape_are_rejected(seed_costs):
    mm, comm = seed_costs
    with pytest.raises(CoCShapeError, match="matmul cost is for k=3072, n=8192"):
        plan_blocks(4096, 4096, 8192, 2, mm, comm)
    with pytest.raises(CoCShapeError, match="comm cost is for rows of n=8192 x 2 bytes"):
        plan_blocks(4096, 3072, 8192, 4, mm, comm)


def test_bad_arguments(seed_costs):
    mm, comm = seed_costs
    with pytest.raises(CoCShapeError, match="M must be a positive integer"):
        plan_blocks(0, 3072, 8192, 2, mm, comm)
    with pytest.raises(ValueError, match="inflation"):
        plan_blocks(4096, 3072, 8192, 2, mm, comm, inflation=0.0)


dims = st.sampled_from([1024, 2048, 3072, 4096, 8192, 14336, 28672])


@st.composite
def shapes_and_costs(draw):
    """Shapes with costs of plausible hardware: 50-1000 TFLOP/s, 20-400 GB/s."""
    K, N = draw(dims), draw(dims)
    dtype_size = draw(st.sampled_from([1, 2, 4]))
    us_per_row = 2 * K * N / (draw(st.floats(50.0, 1000.0)) * 1e6)
    mm = MatmulCost(LinearCost(us_per_row, draw(st.floats(0.0, 50.0))), K, N)
    us_per_mb = 1024 * 1024 / (draw(st.floats(20.0, 400.0)) * 1e3)
    comm_fit = draw(
        st.one_of(
            st.builds(LinearCost, st.just(us_per_mb), st.floats(0.0, 80.0)),
            st.builds(
                PiecewiseQuadLinearCost,
                st.floats(1.0, 16.0),
                st.tuples(st.floats(-0.05, 0.0), st.just(us_per_mb * 2), st.floats(0.0, 30.0)),
                st.tuples(st.just(us_per_mb), st.floats(0.0, 100.0)),
            ),
        )
    )
    M = draw(st.one_of(st.integers(1, 4096), st.integers(4096, 262144)))
    return M, K, N, dtype_size, mm, CommCost(comm_fit, N, dtype_size)


@given(case=shapes_and_costs(), inflation=st.floats(1.0, 1.5))
def test_plan_properties(case, inflation):
    M, K, N, dtype_size, mm, comm = case
    plan = plan_blocks(M, K, N, dtype_size, mm, comm, inflation)

    assert sum(plan.blocks) == M
    assert all(isinstance(b, int) and b > 0 for b in plan.blocks)
    assert plan.bound == ("comm" if comm(M) > mm(M) else "compute")
    if short_block_rows(K, N) >= M:
        assert plan.blocks == (M,)
    if plan.count == 0:
        assert plan == Plan((M,), plan.bound, M, 0, 0)
        return
    assert len(plan.blocks) == plan.count + 1
    longs = plan.blocks[1:] if plan.bound == "comm" else plan.blocks[:-1]
    short = plan.blocks[0] if plan.bound == "comm" else plan.blocks[-1]
    assert set(longs) == {plan.m1}
    assert plan.m1 >= 128 and plan.m1 % 128 == 0
    assert short == plan.m0 >= short_block_rows(K, N)
    # The short block grows only by what aligning the spread long blocks left over.
    assert plan.m0 < short_block_rows(K, N) + 128 * plan.count
