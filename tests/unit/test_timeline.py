"""The two-lane pipeline model: hand-computed timelines and invariants."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coc_shared.cost_curves import LinearCost
from coc_shared.cost_model import SEED_COSTS_FILE, load_costs
from coc_shared.timeline import simulate

MM = LinearCost(1.0, 0.0)  # 1 us per row
COMM = LinearCost(2.0, 0.0)  # 2 us per row


def test_compute_first_by_hand():
    tl = simulate([1, 2, 3], MM, COMM, "compute_first")
    assert tl.mm == ((0, 1), (1, 3), (3, 6))
    # comm_i starts at max(end(mm_i), end(comm_{i-1})).
    assert tl.comm == ((1, 3), (3, 7), (7, 13))
    assert tl.makespan == 13
    assert (tl.total_mm, tl.total_comm, tl.ideal, tl.serial_chunks) == (6, 12, 12, 18)
    # comm busy [1, 13], matmul busy [0, 6]: 7 us of comm run with the matmul idle.
    assert tl.exposed_comm == 7


def test_comm_first_by_hand():
    tl = simulate([1, 2, 3], MM, COMM, "comm_first")
    assert tl.comm == ((0, 2), (2, 6), (6, 12))
    # mm_i starts at max(end(comm_i), end(mm_{i-1})).
    assert tl.mm == ((2, 3), (6, 8), (12, 15))
    assert tl.makespan == 15
    # comm busy [0, 12] of which [2, 3] and [6, 8] overlap a matmul.
    assert tl.exposed_comm == 9


def test_comm_waits_for_its_own_lane():
    # Compute-bound: the comm lane idles between chunks, nothing is exposed but the tail.
    tl = simulate([2, 2, 2], LinearCost(3.0, 0.0), LinearCost(1.0, 0.0))
    assert tl.comm == ((6, 8), (12, 14), (18, 20))
    assert tl.makespan == 20
    assert tl.exposed_comm == 2


def test_serial_is_the_unchunked_run():
    # With a per-call overhead the unchunked run is cheaper than the sum of chunks.
    tl = simulate([1, 2, 3], LinearCost(1.0, 1.0), LinearCost(2.0, 1.0))
    assert tl.serial == (6 + 1) + (12 + 1)
    assert tl.serial_chunks == (6 + 3) + (12 + 3)
    assert tl.gain == pytest.approx((20 - tl.makespan) / 20)


def test_single_block_is_serial():
    tl = simulate([4096], MM, COMM)
    assert tl.makespan == tl.serial == 3 * 4096
    assert tl.exposed_comm == 2 * 4096
    assert tl.gain == 0


def test_seed_example_prediction():
    mm, comm = load_costs(SEED_COSTS_FILE).bind(3072, 8192, 2)
    tl = simulate([512, 896, 896, 896, 896], mm, comm)
    # The seed measured 1874 us serial and 1262 us fused; its fits predict:
    assert tl.makespan == pytest.approx(1282.82, abs=0.01)
    assert tl.serial == pytest.approx(803.0 + comm(4096))
    assert tl.ideal == pytest.approx(comm(512) + 4 * comm(896))
    assert tl.exposed_comm == pytest.approx(tl.makespan - 803.0)


def test_bad_input():
    with pytest.raises(ValueError, match="order"):
        simulate([1], MM, COMM, "sideways")
    with pytest.raises(ValueError, match="positive"):
        simulate([], MM, COMM)
    with pytest.raises(ValueError, match="matmul cost of 1 rows"):
        simulate([1], LinearCost(1.0, -5.0), COMM)


costs = st.builds(LinearCost, st.floats(0.01, 5.0), st.floats(0.0, 50.0))


@given(
    blocks=st.lists(st.integers(1, 4096), min_size=1, max_size=12),
    mm=costs,
    comm=costs,
    order=st.sampled_from(["compute_first", "comm_first"]),
)
def test_timeline_invariants(blocks, mm, comm, order):
    tl = simulate(blocks, mm, comm, order)
    eps = 1e-6 * tl.serial_chunks
    assert tl.ideal - eps <= tl.makespan <= tl.serial_chunks + eps
    # Neither order leaves both lanes idle, so the makespan is the matmul time
    # plus the comm the matmul did not hide.
    assert tl.makespan == pytest.approx(tl.total_mm + tl.exposed_comm, rel=1e-9)
    assert tl.total_mm == pytest.approx(sum(mm(b) for b in blocks), rel=1e-9)
    for lane in (tl.mm, tl.comm):
        assert all(a[1] <= b[0] + eps for a, b in pairwise(lane))
    for (mm_start, mm_end), (comm_start, comm_end) in zip(tl.mm, tl.comm, strict=True):
        if order == "compute_first":
            assert comm_start >= mm_end - eps
        else:
            assert mm_start >= comm_end - eps
    lead = tl.mm if order == "compute_first" else tl.comm
    assert lead[0][0] == 0 and all(a[1] == pytest.approx(b[0]) for a, b in pairwise(lead))
