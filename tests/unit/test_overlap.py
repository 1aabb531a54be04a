"""The overlap engine: layouts equal the serial collectives, for unequal blocks.

Inputs are small integers in float64, so every sum is exact and results must
match the serial collectives bit for bit: a misplaced or missing row cannot
hide inside a tolerance.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from coc_impl import overlap
from coc_impl.block_product import Product
from coc_impl.errors import CoCShapeError
from coc_impl.reducers import CollectiveReducer
from tests.support.dist_helpers import GlooPool, RankFailure, record_collectives, run_threaded

SHARD = 6  # rows per rank on the split axis
K, N = 5, 3
UNEQUAL = {
    "one": [6],
    "unequal": [1, 3, 2],
    "ones": [1] * 6,
}


def integers(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).double()


WEIGHT_T = integers(K, N, seed=1)  # [k, n]; the engine never sees a transposition


def times_weight(rows: torch.Tensor) -> torch.Tensor:
    return rows @ WEIGHT_T


# ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` were renamed in newer torch.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _serial_all_gather(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((dist.get_world_size() * x.shape[0], *x.shape[1:]))
    ALL_GATHER(out, x.contiguous())
    return out


def _serial_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    REDUCE_SCATTER(out, x.contiguous())
    return out


def _serial_all_reduce(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out)
    return out


def all_ops_case(rank: int, tp: int, blocks: list[int]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Every engine entry point next to its serial counterpart, on one rank."""
    group = dist.group.WORLD
    local = integers(SHARD, K, seed=100 + rank)  # this rank's shard (gather inputs)
    full = integers(tp * SHARD, K, seed=200 + rank)  # this rank's partial rows (reduce inputs)
    inputs = (local.clone(), full.clone())
    gm = overlap.all_gather_matmul(local, times_weight, blocks, group, keep_gathered=True)
    gathered = overlap.all_gather(local, blocks, group)
    rs = overlap.matmul_reduce_scatter(full, times_weight, blocks, group)
    rs_plain = overlap.matmul_reduce_scatter(full, None, blocks, group)
    ar = overlap.matmul_all_reduce(full, times_weight, [b * tp for b in blocks], group)
    ar_plain = overlap.matmul_all_reduce(full, None, [b * tp for b in blocks], group)
    return {
        "all_gather_matmul": (gm.output, times_weight(_serial_all_gather(local))),
        "all_gather_matmul.gathered": (gm.gathered, _serial_all_gather(local)),
        "all_gather": (gathered.wait(), _serial_all_gather(local)),
        "matmul_reduce_scatter": (rs.wait(), _serial_reduce_scatter(times_weight(full))),
        "reduce_scatter": (rs_plain.wait(), _serial_reduce_scatter(full)),
        "matmul_all_reduce": (ar.wait(), _serial_all_reduce(times_weight(full))),
        "all_reduce": (ar_plain.wait(), _serial_all_reduce(inputs[1])),
        "inputs untouched": (torch.cat([local.flatten(), full.flatten()]),
                             torch.cat([t.flatten() for t in inputs])),
    }


def assert_serial_layout(results: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]) -> None:
    for rank, per_op in enumerate(results):
        for op, (chunked, serial) in per_op.items():
            assert torch.equal(chunked, serial), f"{op} differs from the serial layout on rank {rank}"


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("blocks", list(UNEQUAL.values()), ids=list(UNEQUAL))
def test_every_op_matches_serial_layout(tp: int, blocks: list[int]) -> None:
    assert_serial_layout(run_threaded(tp, all_ops_case, blocks))


def test_product_writes_every_block_into_the_result_and_reduces_in_place() -> None:
    """A Product skips the per-block copies: same bits as a plain matmul, one result buffer."""

    class InPlaceSpy(CollectiveReducer):
        def __init__(self) -> None:
            self.aliased: list[bool] = []

        def all_reduce(self, partial, out, group):  # type: ignore[no-untyped-def]
            self.aliased.append(partial.data_ptr() == out.data_ptr())
            return super().all_reduce(partial, out, group)

    def case(rank: int, tp: int) -> tuple[bool, ...]:
        full = integers(tp * SHARD, K, seed=200 + rank)
        out = full.new_empty((tp * SHARD, N))
        spy = InPlaceSpy()
        direct = overlap.matmul_all_reduce(
            full, Product(WEIGHT_T), [1, 5, 6], dist.group.WORLD, reducer=spy, out=out
        ).wait()
        plain = overlap.matmul_all_reduce(full, times_weight, [1, 5, 6], dist.group.WORLD).wait()
        return direct.data_ptr() == out.data_ptr(), spy.aliased == [True] * 3, torch.equal(direct, plain)

    assert all(all(flags) for flags in run_threaded(2, case))


def test_product_pads_thin_blocks_and_the_contraction() -> None:
    rows = integers(3, K, seed=7)
    padded = Product(torch.cat([WEIGHT_T, integers(2, N, seed=8)]), pad_k=2, min_rows=16)
    assert torch.equal(padded(rows), rows @ WEIGHT_T)  # the extra k rows meet zero columns
    out = torch.full((3, N), float("nan"), dtype=torch.float64)
    assert padded.into(rows, out) is out and torch.equal(out, rows @ WEIGHT_T)
    assert padded.empty(rows).shape == (3, N)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_product_reads_only_the_values_of_strided_operands(dtype: torch.dtype) -> None:
    """Column slices of NaN-padded buffers multiply as their values do: no GEMM reads past a row's end."""

    def column_slice(t: torch.Tensor) -> torch.Tensor:
        wide = torch.full((t.shape[0], t.shape[1] + 6), float("nan"), dtype=dtype)
        wide[:, 3:3 + t.shape[1]] = t
        return wide[:, 3:3 + t.shape[1]]

    x, w = integers(257, 3, seed=3).to(dtype), integers(3, 81, seed=4).to(dtype)
    product = Product(column_slice(w))
    assert torch.equal(product(column_slice(x)), x @ w)
    assert torch.equal(product.into(column_slice(x), product.empty(x)), x @ w)


def test_expected_rows_are_rank_major() -> None:
    """Independent of the serial collectives: row i of the gather is rank i // shard's row."""

    def case(rank: int, tp: int) -> torch.Tensor:
        local = torch.full((SHARD, 1), float(rank)) + torch.arange(SHARD, dtype=torch.float64)[:, None] / 10
        return overlap.all_gather_matmul(local.double(), lambda r: r, [2, 1, 3], dist.group.WORLD).output

    out = run_threaded(2, case)[0][:, 0]
    expected = torch.cat([r + torch.arange(SHARD, dtype=torch.float64) / 10 for r in range(2)])
    assert torch.equal(out, expected)


def test_single_block_gathers_straight_into_out() -> None:
    def case(rank: int, tp: int) -> bool:
        local = integers(SHARD, K, seed=rank)
        out = local.new_empty((tp * SHARD, K))
        result = overlap.all_gather(local, [SHARD], dist.group.WORLD, out=out).wait()
        return result.data_ptr() == out.data_ptr() and torch.equal(out, _serial_all_gather(local))

    assert all(run_threaded(2, case))


def compute_first_order(rank: int, tp: int, log) -> None:
    def logged_matmul(rows: torch.Tensor) -> torch.Tensor:
        log.add(("mm", rows.shape[0]))
        return times_weight(rows)

    full = integers(tp * SHARD, K, seed=rank)
    in_flight = overlap.matmul_reduce_scatter(full, logged_matmul, [1, 3, 2], dist.group.WORLD)
    log.add(("returned", None))
    in_flight.wait()


def communicate_first_order(rank: int, tp: int, log) -> None:
    def logged_matmul(rows: torch.Tensor) -> torch.Tensor:
        log.add(("mm", rows.shape[0]))
        return times_weight(rows)

    local = integers(SHARD, K, seed=rank)
    overlap.all_gather_matmul(local, logged_matmul, [1, 3, 2], dist.group.WORLD)


def _kinds(events: list[tuple[str, object]]) -> list[str]:
    return [name.split("_")[0] if name not in ("mm", "wait", "returned") else name for name, _ in events]


def test_compute_first_launches_each_block_before_the_next_matmul() -> None:
    with record_collectives() as log:
        run_threaded(2, compute_first_order, log)
    for rank in range(2):
        assert _kinds(log.events[rank]) == [
            "mm", "reduce", "mm", "reduce", "mm", "reduce", "returned", "wait", "wait", "wait",
        ]
        # the blocks' rows: [1, 3, 2] of each of the 2 shards
        assert [rows for name, rows in log.events[rank] if name == "mm"] == [2, 6, 4]


def test_communicate_first_prefetches_the_next_gather() -> None:
    with record_collectives() as log:
        run_threaded(2, communicate_first_order, log)
    for rank in range(2):
        assert _kinds(log.events[rank]) == [
            "all", "all", "wait", "mm", "all", "wait", "mm", "wait", "mm",
        ]


class AscendingRankReducer:
    """A deterministic reducer: gather the partials, sum ranks 0, 1, ... in fp32."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _gathered_sum(self, partial, out, group, pick):
        tp = group.size()
        gathered = partial.new_empty((tp * partial.shape[0], *partial.shape[1:]))
        work = ALL_GATHER(gathered, partial, group=group, async_op=True)
        reducer = self

        class Finish:
            def wait(self) -> None:
                work.wait()
                parts = [pick(p) for p in gathered.chunk(tp)]
                acc = parts[0].float()
                for p in parts[1:]:
                    acc = acc + p.float()
                out.copy_(acc)
                reducer.calls.append("finished")

        return Finish()

    def all_reduce(self, partial, out, group):
        self.calls.append("all_reduce")
        return self._gathered_sum(partial, out, group, lambda p: p)

    def reduce_scatter(self, partial, out, group):
        self.calls.append("reduce_scatter")
        rank, rows = group.rank(), out.shape[0]
        return self._gathered_sum(partial, out, group, lambda p: p[rank * rows : (rank + 1) * rows])


def plugged_reducer_case(rank: int, tp: int) -> tuple[bool, list[str]]:
    reducer = AscendingRankReducer()
    group = dist.group.WORLD
    full = integers(tp * SHARD, K, seed=300 + rank).float()
    weight = WEIGHT_T.float()
    rs = overlap.matmul_reduce_scatter(full, lambda r: r @ weight, [2, 4], group, reducer=reducer).wait()
    ar = overlap.matmul_all_reduce(full, lambda r: r @ weight, [5, 7], group, reducer=reducer).wait()
    ok = torch.equal(rs, _serial_reduce_scatter(full @ weight)) and torch.equal(
        ar, _serial_all_reduce(full @ weight)
    )
    return ok, reducer.calls


def test_reducer_is_pluggable() -> None:
    for ok, calls in run_threaded(2, plugged_reducer_case):
        assert ok
        assert calls == ["reduce_scatter", "reduce_scatter", "finished", "finished",
                         "all_reduce", "all_reduce", "finished", "finished"]


def bad_blocks_case(rank: int, tp: int, op: str, blocks: list[int]) -> str:
    local = integers(SHARD, K, seed=rank)
    full = integers(tp * SHARD, K, seed=rank)
    group = dist.group.WORLD
    calls = {
        "all_gather_matmul": lambda: overlap.all_gather_matmul(local, times_weight, blocks, group),
        "all_gather": lambda: overlap.all_gather(local, blocks, group),
        "matmul_reduce_scatter": lambda: overlap.matmul_reduce_scatter(full, times_weight, blocks, group),
        "matmul_all_reduce": lambda: overlap.matmul_all_reduce(full, times_weight, blocks, group),
    }
    with pytest.raises(CoCShapeError, match="blocks") as info:
        calls[op]()
    return str(info.value)


OPS = ["all_gather_matmul", "all_gather", "matmul_reduce_scatter", "matmul_all_reduce"]
BAD_BLOCKS = {"short": [2, 2], "long": [4, 4], "zero": [6, 0], "negative": [3, -1, 4]}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("blocks", list(BAD_BLOCKS.values()), ids=list(BAD_BLOCKS))
def test_blocks_must_cover_the_rows_exactly(op: str, blocks: list[int]) -> None:
    with record_collectives() as log:
        run_threaded(2, bad_blocks_case, op, blocks)
    assert not any(log.launches(rank) for rank in range(2)), "a collective ran before the check"


def test_out_must_have_the_result_shape() -> None:
    def case(rank: int, tp: int) -> None:
        full = integers(tp * SHARD, K, seed=rank)
        with pytest.raises(CoCShapeError, match="out must be"):
            wrong = torch.empty(SHARD + 1, N, dtype=torch.float64)
            overlap.matmul_reduce_scatter(full, times_weight, [SHARD], dist.group.WORLD, out=wrong)

    run_threaded(2, case)


def test_equal_blocks() -> None:
    assert overlap.equal_blocks(12, 4) == [3, 3, 3, 3]
    with pytest.raises(CoCShapeError, match="12 rows cannot be split into 5"):
        overlap.equal_blocks(12, 5)


def test_rank_failure_is_reported() -> None:
    def case(rank: int, tp: int) -> None:
        if rank == 1:
            raise ValueError("boom")

    with pytest.raises(RankFailure, match="rank 1 failed"):
        run_threaded(2, case)


@pytest.fixture(scope="module")
def gloo_pair():
    pool = GlooPool(2)
    yield pool
    pool.close()


def test_real_gloo_processes_async(gloo_pair: GlooPool) -> None:
    """Real gloo ranks: several collectives really in flight at once, same layouts."""
    assert_serial_layout(gloo_pair.run(all_ops_case, UNEQUAL["unequal"]))
    assert_serial_layout(gloo_pair.run(all_ops_case, UNEQUAL["ones"]))
