"""Deterministic fused reductions: the reference's (bitwise equal for any tiling, run and rank timing, where its GEMM
is row-invariant), and the suite's rules (deterministic, split-invariant, and what a case needs to be able to fail)."""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from coc_impl import fused
from coc_impl.deterministic import finish, fp32_partial, fp32_weight, rank_ordered_sum
from conformance.judge.determinism import arrival_ordered
from tests.support.dist_helpers import GlooPool, run_threaded

# --------------------------------------------------------------------------- local pieces

@pytest.mark.parametrize("n", [16, 7, 33])
@pytest.mark.parametrize("transpose", [False, True])
def test_tile_rows_have_the_bits_of_the_whole_gemm(n: int, transpose: bool) -> None:
    """A 1-row (or thin, or odd-width) tile must not take a different BLAS path."""
    torch.manual_seed(0)
    m, k = 70, 45
    x = torch.randn(m, k)
    w_kn = torch.randn(k, n)
    if transpose:
        w_kn = w_kn.t().contiguous().t()  # [n, k] storage read as [k, n]
    w32 = fp32_weight(w_kn)
    whole = fp32_partial(x, w32, n)
    assert whole.shape == (m, n) and whole.dtype == torch.float32
    for rows in (1, 2, 3, 5, 11, 13, 17, 40):
        for start in (0, 1, m - rows):
            tile = fp32_partial(x[start:start + rows], w32, n)
            assert torch.equal(tile, whole[start:start + rows]), (rows, start)
    if n % 16 == 0:  # no padding needed: the definition is the plain fp32 matmul
        assert torch.equal(whole, x @ w_kn)


def test_rank_ordered_sum_adds_left_to_right() -> None:
    big = torch.tensor([1e8], dtype=torch.float32)
    one = torch.tensor([1.0], dtype=torch.float32)
    # (1e8 + 1) - 1e8 == 0 in float32, while 1e8 + (1 - 1e8) == 1 ... the order is visible.
    assert rank_ordered_sum([big, one, -big]).item() == 0.0
    assert rank_ordered_sum([big, -big, one]).item() == 1.0
    parts = [torch.randn(5, 3) for _ in range(4)]
    expected = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    before = parts[0].clone()
    assert torch.equal(rank_ordered_sum(parts), expected)
    assert torch.equal(parts[0], before)  # inputs untouched


def test_finish_adds_the_bias_in_fp32_before_the_single_cast() -> None:
    total = torch.tensor([1.0 + 2.0**-11], dtype=torch.float32)
    bias = torch.tensor([2.0**-11], dtype=torch.float16)
    out = finish(total, bias, torch.float16)
    assert out.dtype == torch.float16
    assert out.item() == 1.0 + 2.0**-10  # cast-then-add would round to 1.0
    assert finish(total, None, torch.float32).item() == total.item()


# --------------------------------------------------------------------------- serial reference

def _inputs(rank: int, m: int, k: int, n: int, dtype: torch.dtype, transpose: bool, bias: bool):
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(k, n, generator=gen).to(dtype)
    if transpose:
        w = w.t().contiguous()
    b = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(dtype) if bias else None
    return x, w, b


def _serial_deterministic(tp: int, m: int, k: int, n: int, dtype, transpose: bool, bias: bool):
    """The documented definition, written out independently of coc_impl."""
    total = None
    for rank in range(tp):
        x, w, b = _inputs(rank, m, k, n, dtype, transpose, bias)
        w_kn = (w.t() if transpose else w).float()
        xp = torch.zeros(max(m, 16), k)
        xp[:m] = x.float()
        wp = torch.zeros(k, -(-n // 16) * 16)
        wp[:, :n] = w_kn
        partial = (xp @ wp)[:m, :n]
        total = partial if total is None else total + partial
    if b is not None:
        total = total + b.float()
    return total.to(dtype)


def _det_op(op: str, x, w, b, transpose: bool, blocks):
    fn = fused.matmul_all_reduce if op == "ar" else fused.matmul_reduce_scatter
    return fn(x, w, b, group=dist.group.WORLD, transpose_weight=transpose, deterministic=True, blocks=blocks)


def _run_tilings(rank: int, tp: int, op: str, shape, dtype, transpose: bool, bias: bool, tilings) -> list:
    x, w, b = _inputs(rank, *shape, dtype, transpose, bias)
    return [_det_op(op, x, w, b, transpose, blocks) for blocks in tilings]


CASES = [
    # op, tp, (m, k, n), dtype, transpose, bias, tilings (of m for "ar", of m/tp for "rs")
    ("ar", 2, (40, 24, 16), torch.float16, False, True, [None, [40], [1, 39], [13, 1, 1, 25], [8] * 5]),
    ("ar", 4, (12, 20, 9), torch.float32, True, True, [None, [1] * 12, [5, 7], [11, 1]]),
    ("ar", 2, (33, 16, 24), torch.bfloat16, True, False, [None, [32, 1], [3, 30]]),
    ("rs", 2, (40, 24, 16), torch.float16, True, True, [None, [20], [1, 19], [7, 1, 12]]),
    ("rs", 4, (48, 20, 7), torch.float32, False, True, [None, [1] * 12, [2, 10], [11, 1]]),
    ("rs", 4, (16, 16, 32), torch.bfloat16, False, False, [None, [1, 3], [2, 2]]),
]


@pytest.mark.parametrize("op,tp,shape,dtype,transpose,bias,tilings", CASES)
def test_deterministic_is_the_serial_definition_for_every_tiling(op, tp, shape, dtype, transpose, bias,
                                                                  tilings):
    per_rank = run_threaded(tp, _run_tilings, op, shape, dtype, transpose, bias, tilings)
    expected = _serial_deterministic(tp, *shape, dtype, transpose, bias)
    m = shape[0]
    for rank, outs in enumerate(per_rank):
        want = expected if op == "ar" else expected[rank * m // tp:(rank + 1) * m // tp]
        for blocks, out in zip(tilings, outs, strict=True):
            assert out.dtype == dtype
            assert torch.equal(out, want), f"rank {rank}, blocks {blocks}"


# --------------------------------------------------------------------------- real gloo, jittered ranks

_COLLECTIVES = tuple(
    name
    for name in ("all_gather_single", "all_gather_into_tensor", "all_to_all_single", "all_reduce",
                 "reduce_scatter_single", "reduce_scatter_tensor")
    if hasattr(dist, name)
)


def _jittered_runs(rank: int, tp: int, op: str, shape, dtype, transpose: bool, tilings) -> list:
    """Every collective first sleeps a random, rank- and run-specific time."""
    torch.set_num_threads(1)
    rng = random.Random(rank * 7919 + 1)
    originals = {name: getattr(dist, name) for name in _COLLECTIVES}

    def jitter(fn):
        def wrapped(*args, **kwargs):
            time.sleep(rng.uniform(0.0, 0.004))
            return fn(*args, **kwargs)
        return wrapped

    for name, fn in originals.items():
        setattr(dist, name, jitter(fn))
    try:
        outs = []
        for blocks in tilings:
            x, w, b = _inputs(rank, *shape, dtype, transpose, True)
            time.sleep(rng.uniform(0.0, 0.01))
            outs.append(_det_op(op, x, w, b, transpose, blocks))
        return outs
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


@pytest.fixture(scope="module")
def gloo4():
    pool = GlooPool(4)
    yield pool
    pool.close()


@pytest.mark.parametrize(
    "op,shape,dtype,tilings",
    [
        ("ar", (48, 32, 24), torch.float16, [None, None, None, [1, 47], [16, 1, 31], [6] * 8]),
        ("rs", (48, 32, 20), torch.bfloat16, [None, None, None, [1, 11], [5, 7], [3] * 4]),
    ],
)
def test_deterministic_under_rank_jitter_on_gloo(gloo4, op, shape, dtype, tilings) -> None:
    per_rank = gloo4.run(_jittered_runs, op, shape, dtype, True, tilings)
    expected = _serial_deterministic(4, *shape, dtype, True, True)
    m = shape[0]
    for rank, outs in enumerate(per_rank):
        want = expected if op == "ar" else expected[rank * m // 4:(rank + 1) * m // 4]
        for blocks, out in zip(tilings, outs, strict=True):
            assert torch.equal(out, want), f"rank {rank}, blocks {blocks}"


_ORDER_SENSITIVE = (1.0, 1e8, 1.0, -1e8)  # float32 sums of these depend on the order


def _order_sensitive_runs(rank: int, tp: int, op: str, tilings) -> list:
    torch.set_num_threads(1)
    # Row i of rank r holds _ORDER_SENSITIVE[(r + i) % 4]: every rotation of the order occurs.
    x = torch.tensor([[_ORDER_SENSITIVE[(rank + i) % 4]] for i in range(16)])
    w = torch.ones(1, 1)
    return [_det_op(op, x, w, None, False, blocks) for blocks in tilings]


@pytest.mark.parametrize("op,tilings", [("ar", [None, [3, 13], [1] * 16]), ("rs", [None, [1, 3], [2, 2]])])
def test_ascending_rank_order_on_four_gloo_ranks(gloo4, op: str, tilings) -> None:
    """gloo's own reduction adds in ring order; the deterministic ops must not."""
    per_rank = gloo4.run(_order_sensitive_runs, op, tilings)
    expected = torch.empty(16, 1)
    for i in range(16):
        total = torch.tensor(_ORDER_SENSITIVE[i % 4])
        for r in range(1, 4):
            total = total + torch.tensor(_ORDER_SENSITIVE[(r + i) % 4])
        expected[i] = total
    assert expected.unique().numel() > 1  # the rotations really sum differently
    for rank, outs in enumerate(per_rank):
        want = expected if op == "ar" else expected[rank * 4:(rank + 1) * 4]
        for blocks, out in zip(tilings, outs, strict=True):
            assert torch.equal(out, want), (rank, blocks, out.flatten().tolist())


# --------------------------------------------------------------------------- split invariance, and what can fail

def _cpu_measured(monkeypatch: pytest.MonkeyPatch, differ_at: list[int]) -> None:
    """This process's measurement of its CPU GEMM, as given (no test asserts a property of the machine's BLAS)."""
    from coc_impl import split_invariance
    from coc_shared.gemm_rows import GemmRows, ShapeRows

    measured = GemmRows("cpu", "float32", 256, (ShapeRows(96, 64, ()), ShapeRows(1024, 1024, tuple(differ_at))))
    monkeypatch.setattr(split_invariance, "cpu_rows", lambda: measured, raising=False)


@pytest.mark.parametrize("differ_at, claims", [
    ([], True),
    ([1, 2, 3], True),  # below the reference's 16 padded rows: no tile of its has them (this CI machine)
    (list(range(1, 129)), False),  # an AVX-512 Xeon with MKL at k = n = 1024 (issue 50)
])
def test_the_reference_claims_the_cpu_only_where_this_process_measured_its_gemm_to_hold(
        monkeypatch: pytest.MonkeyPatch, differ_at: list[int], claims: bool) -> None:
    from coc_impl.reference import ReferenceCoC
    from coc_shared import gemm_rows
    from conformance.protocol import declarations

    monkeypatch.delenv(gemm_rows.ENV, raising=False)
    _cpu_measured(monkeypatch, differ_at)
    assert bool(declarations(ReferenceCoC(), device="cpu").split_invariant_ops) is claims


def test_the_cpu_is_measured_once_per_process_on_the_shapes_the_claim_covers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of every padded row count up to a whole product, on the weights where one MKL CPU rounds by the row
    count (k = n = 1024), with one thread (as ranks run) and the process's; the measurement as read back."""
    from coc_impl import split_invariance
    from coc_shared import gemm_rows

    measured: list[tuple[object, ...]] = []

    def measure(device: str, shapes: object, rows: int, **kw: object) -> gemm_rows.GemmRows:
        measured.append((device, tuple(shapes), rows, kw["counts"], torch.get_num_threads()))  # type: ignore[arg-type]
        return gemm_rows.GemmRows("cpu", "float32", rows, tuple(gemm_rows.ShapeRows(k, n, (16,) if k == 1024 else ())
                                                                for k, n in shapes))  # type: ignore[attr-defined]

    monkeypatch.delenv(gemm_rows.ENV, raising=False)
    monkeypatch.setattr(gemm_rows, "measure", measure)
    split_invariance.cpu_rows.cache_clear()
    try:
        assert split_invariance.split_invariant_devices() == split_invariance.split_invariant_devices() == ()
    finally:
        split_invariance.cpu_rows.cache_clear()
    assert len(measured) == len({1, torch.get_num_threads()}) and measured[0][4] == 1, measured
    device, shapes, rows, counts, _ = measured[0]
    assert device == "cpu" and (1024, 1024) in shapes and rows >= max(counts)  # type: ignore[operator,type-var]
    assert min(counts) == split_invariance.MIN_GEMM_ROWS and rows in counts  # type: ignore[type-var,operator]
    reread = gemm_rows.GemmRows.from_dict(json.loads(json.dumps(split_invariance.cpu_rows().to_dict())))
    assert reread == split_invariance.cpu_rows()


@pytest.mark.parametrize("device, differ_at, claims", [
    ("cpu", [1, 2, 3], {"cpu"}),  # below the reference's 16 padded rows: no tile of its has them
    ("cpu", [1, 2, 3, 16, 32, 128], set()),  # a CPU whose GEMM rounds by the row count (issue 42's MKL)
    ("cuda", list(range(1, 513)), {"cpu"}),  # the H200's float32 GEMM
    ("cuda", [], {"cpu", "cuda"}),
])
def test_the_reference_claims_split_invariance_only_where_its_gemm_was_measured_to_hold(
        tmp_path, monkeypatch: pytest.MonkeyPatch, device: str, differ_at: list[int], claims: set[str]) -> None:
    from coc_impl.reference import ReferenceCoC
    from coc_shared import gemm_rows
    from conformance.protocol import DETERMINISTIC_OPS, declarations

    path = tmp_path / "device-check.json"
    path.write_text(json.dumps({"gemm_rows": {"device": device, "dtype": "float32", "rows": 4096,
                                              "shapes": [{"k": 1024, "n": 1024, "differ_at": differ_at}]}}))
    monkeypatch.setenv(gemm_rows.ENV, str(path))
    _cpu_measured(monkeypatch, [])  # the device check's file wins over this process's own measurement
    for kind in ("cpu", "cuda", "npu"):
        declared = declarations(ReferenceCoC(), device=kind).split_invariant_ops
        assert declared == (frozenset(DETERMINISTIC_OPS) if kind in claims else frozenset()), kind


def test_without_a_device_check_the_reference_claims_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from coc_impl.reference import ReferenceCoC
    from coc_shared import gemm_rows
    from conformance.protocol import declarations

    monkeypatch.delenv(gemm_rows.ENV, raising=False)
    _cpu_measured(monkeypatch, [])
    assert declarations(ReferenceCoC()).split_invariant_ops
    assert not declarations(ReferenceCoC(), device="cuda").split_invariant_ops


@pytest.mark.parametrize("raw, why", [
    ("matmul_all_reduce", "must name ops"),
    (("all_gather_matmul",), "must name ops"),
    ({"": ("matmul_all_reduce",)}, "keys must be device kinds"),
    # keys that name no device kind ranks run on would judge nothing anywhere (issue 50)
    ({"gpu": ("matmul_all_reduce",)}, "keys must be device kinds"),
    ({"CUDA": ("matmul_all_reduce",)}, "keys must be device kinds"),
    ({"cuda:0": ("matmul_all_reduce",)}, "keys must be device kinds"),
])
def test_a_malformed_split_invariance_declaration_is_refused(raw: object, why: str) -> None:
    from conformance.protocol import DeclarationError, declarations

    class Declares:
        name = "declares"
        split_invariant_ops = raw

    with pytest.raises(DeclarationError, match=why):
        declarations(Declares())



def test_a_session_start_refuses_plain_declarations_without_computing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's up-front check reads plain declarations and leaves a computed one (the reference measures its
    GEMM, importing torch) to the cases that judge by it: every pytest session loads the plugin."""
    import conformance.plugin as plugin
    from conformance.protocol import DeclarationError, declarations

    reads: list[str] = []

    class Measures:
        name = "measures"

        @property
        def split_invariant_ops(self) -> dict[str, tuple[str, ...]]:
            reads.append("measured")
            return {"cpu": ("matmul_all_reduce",)}

    assert not declarations(Measures(), computed=False).split_invariant_ops and reads == []
    assert declarations(Measures()).split_invariant_ops == {"matmul_all_reduce"} and reads == ["measured"]

    class PlainAndMalformed:
        name = "plain"
        split_invariant_ops = {"gpu": ("matmul_all_reduce",)}

    with pytest.raises(DeclarationError, match="keys must be device kinds"):
        declarations(PlainAndMalformed(), computed=False)
    seen: list[bool] = []
    monkeypatch.setattr("conformance.protocol.declarations", lambda impl, **kw: seen.append(kw.get("computed", True)))
    monkeypatch.setattr("coc_shared.megatron_range.check", lambda: None)
    config = type("Config", (), {"getoption": lambda self, name, default=None: None, "workerinput": None})()
    monkeypatch.setattr(plugin, "is_xdist_worker", lambda config: False)
    monkeypatch.setattr(plugin, "impl_spec", lambda config: "coc_impl.reference:ReferenceCoC")
    monkeypatch.setattr(plugin, "_check_shared_devices", lambda config: None)
    plugin.pytest_sessionstart(type("Session", (), {"config": config})())
    assert seen == [False]


def _det_run(tp: int, dtype: str = "float32", **changes: object):
    from conformance.contract.jobs import OpRun
    from conformance.contract.problems import Problem

    problem = Problem(64, 96, 64, dtype, seed=17, spread=bool(changes.pop("spread", True)),
                      exact=bool(changes.pop("exact", False)))
    settings: dict[str, object] = {"tilings": (None, (64,), (1, 61, 2)), "runs": 3, **changes}
    return OpRun("matmul_all_reduce", (problem,), tp, deterministic=True, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("tp", [3, 4, 8])
def test_spread_data_shows_a_reordered_tp_sum_in_every_dtype(tp: int, dtype: str) -> None:
    from conformance.judge.determinism import cannot_fail

    assert cannot_fail(_det_run(tp, dtype)) == ""


@pytest.mark.parametrize("run, why", [
    (lambda: _det_run(2), "two ranks commute"),
    (lambda: _det_run(4, "bfloat16", spread=False), "the same bits for the TP sum in any order"),
    (lambda: _det_run(4, exact=True, spread=False), "exact data"),
    (lambda: _det_run(4, runs=1), "one run per tiling"),
    (lambda: replace(_det_run(4), tilings=(None, (64,), (64,))), "repeat one another"),
])
def test_a_deterministic_case_that_cannot_fail_says_why(run, why: str) -> None:
    """The fixed suite calls such a case a suite error (``test_deterministic_is_bitwise_reproducible``)."""
    from conformance.judge.determinism import cannot_fail

    assert why in cannot_fail(run())


def _outcomes(results_per_rank: list[list[torch.Tensor]]):
    from conformance.contract.results import OpCallResults, OpRunOutcome

    return [OpRunOutcome([OpCallResults(list(results), [None] * len(results))], 0, rank,
                         tuple(range(len(results_per_rank)))) for rank, results in enumerate(results_per_rank)]


def _judged(run, outcomes, declared: frozenset[str]) -> dict[str, tuple[str, str]]:
    from conformance.judge.op_verdicts import judge_deterministic
    from conformance.record.verdicts import Verdicts

    verdicts = Verdicts()
    judge_deterministic(verdicts, [(run, outcomes)], declared)
    return {r.name: (r.outcome, r.message) for r in verdicts.results}


def test_tilings_that_differ_pass_unless_split_invariance_is_declared() -> None:
    run = _det_run(3)
    a, b = torch.ones(64, 64), torch.full((64, 64), 1.0 + 2.0**-20)
    outcomes = _outcomes([[a, a, a, b, b, b, a, a, a]] * 3)  # tiling after tiling, run after run
    undeclared = _judged(run, outcomes, frozenset())
    assert undeclared["deterministic: bitwise reproducible"][0] == "passed"
    assert undeclared["split-invariant: bitwise across tilings"][0] == "not judged"
    declared = _judged(run, outcomes, frozenset({"matmul_all_reduce"}))
    outcome, message = declared["split-invariant: bitwise across tilings"]
    assert outcome == "failed" and "tiling [64] differs bitwise from its own tiling" in message, message


def test_a_run_that_differs_from_the_run_before_under_one_tiling_fails_deterministic() -> None:
    run = _det_run(3)
    a, b = torch.ones(64, 64), torch.full((64, 64), 1.0 + 2.0**-20)
    judged = _judged(run, _outcomes([[a, a, a, a, a, a, a, a, a]] * 2 + [[a, a, a, a, b, a, a, a, a]]),
                     frozenset({"matmul_all_reduce"}))
    outcome, message = judged["deterministic: bitwise reproducible"]
    assert outcome == "failed" and "rank 2, tiling [64]: run 1 differs bitwise from run 0" in message, message
    assert "split-invariant: bitwise across tilings" in judged


def test_one_tiling_records_no_split_invariance_check() -> None:
    run = replace(_det_run(3), tilings=(None,))
    a = torch.ones(64, 64)
    assert set(_judged(run, _outcomes([[a, a, a]] * 3), frozenset())) == {"deterministic: bitwise reproducible"}


def test_no_run_to_judge_records_no_deterministic_check() -> None:
    """Every run refused: nothing was compared, so nothing is recorded (an empty loop is no pass)."""
    from conformance.judge.op_verdicts import judge_deterministic
    from conformance.record.verdicts import Verdicts

    verdicts = Verdicts()
    judge_deterministic(verdicts, [], frozenset({"matmul_all_reduce"}))
    assert verdicts.results == []


@pytest.mark.parametrize("backend, value, ordered", [
    ("hccl", None, True), ("hccl", "false", True), ("hccl", "TRUE", False), ("hccl", "strict", False),
    ("gloo", None, False), ("nccl", None, False), ("threaded", None, False), (None, None, False),
])
def test_only_a_backend_reducing_in_arrival_order_leaves_a_default_mode_nothing_to_judge(
        backend: str | None, value: str | None, ordered: bool) -> None:
    environ = {} if value is None else {"HCCL_DETERMINISTIC": value}
    why = arrival_ordered(backend, environ)
    assert bool(why) == ordered
    if ordered:
        assert "HCCL_DETERMINISTIC" in why and ("unset" if value is None else repr(value)) in why
