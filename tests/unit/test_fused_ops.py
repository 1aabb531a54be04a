"""The fused ops (portable backend) against the serial composition of matmul and collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from coc_impl import fused, overlap
from coc_impl.backends import ascend, npu_runtime, portable
from coc_impl.errors import (
    CoCArgumentError,
    CoCBackendUnavailable,
    CoCFusedTPError,
    CoCShapeError,
)
from coc_impl.validated_call import ValidatedCall
from coc_shared.cost_model import SEED_COSTS_FILE, load_costs
from tests.support.dist_helpers import GlooPool, run_threaded

OPS = ("ar", "rs", "ag", "ag2")
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _inputs(rank: int, m: int, k: int, n: int, dtype: torch.dtype, transpose: bool, bias: bool):
    gen = torch.Generator().manual_seed(500 + rank)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen) if transpose else torch.randn(k, n, generator=gen)
    b = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(dtype) if bias else None
    return x, w.to(dtype), b


def _fused(op: str, x, w, b, transpose: bool, blocks, **kwargs):
    """Returns (output, gathered x or None)."""
    common = dict(group=dist.group.WORLD, transpose_weight=transpose, blocks=blocks, **kwargs)
    if op == "ar":
        return fused.matmul_all_reduce(x, w, b, **common), None
    if op == "rs":
        return fused.matmul_reduce_scatter(x, w, b, **common), None
    if op == "ag":
        return fused.all_gather_matmul(x, w, b, **common), None
    return fused.all_gather_matmul_v2(x, w, b, **common)


def _serial(op: str, x, w, b, transpose: bool):
    """The unfused composition: one matmul, one blocking collective, then the bias."""
    group, tp = dist.group.WORLD, dist.get_world_size()
    w_kn = w.t() if transpose else w
    gathered = None
    if op == "ar":
        y = x @ w_kn
        dist.all_reduce(y, group=group)
    elif op == "rs":
        full = x @ w_kn
        y = full.new_empty((full.shape[0] // tp, full.shape[1]))
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(y, full, group=group)
    else:
        gathered = x.new_empty((tp * x.shape[0], x.shape[1]))
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered, x, group=group)
        y = gathered @ w_kn
    return (y if b is None else y + b), gathered


def _compare(rank: int, tp: int, op: str, shape, dtype, transpose: bool, bias: bool, tilings) -> list:
    torch.set_num_threads(1)
    x, w, b = _inputs(rank, *shape, dtype, transpose, bias)
    ref, ref_gathered = _serial(op, x, w, b, transpose)
    results = []
    for blocks in tilings:
        out, gathered = _fused(op, x, w, b, transpose, blocks)
        results.append((out, gathered))
    return [ref, ref_gathered, results]


def _check(per_rank: list, op: str, dtype: torch.dtype, tilings) -> None:
    for ref, ref_gathered, results in per_rank:
        tol = 8 * EPS[dtype] * max(ref.abs().max().item(), 1.0)
        for blocks, (out, gathered) in zip(tilings, results, strict=True):
            assert out.dtype == ref.dtype and out.shape == ref.shape, blocks
            assert (out - ref).abs().max().item() <= tol, blocks
            if op == "ag2":
                assert torch.equal(gathered, ref_gathered), blocks  # rows rank-major, bit exact
            if op in ("ag", "ag2"):
                # No reduction: the rows' bits do not depend on the tiling either.
                assert torch.equal(out, results[0][0]), blocks


TILINGS = {  # per op, for the shapes below: tiles of m ("ar"), m/tp ("rs"), the shard m ("ag")
    "ar": [None, [1, 23], [5, 1, 18], [12, 12]],
    "rs": [None, [1, 11], [5, 7], [3] * 4],
    "ag": [None, [1, 23], [7, 17], [6] * 4],
}


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_serial_composition(op: str, tp: int, dtype: torch.dtype) -> None:
    tilings = TILINGS[op[:2]]
    shape = (12 * tp if op == "rs" else 24, 40, 24)  # rs tiles the m/tp = 12 rows of each rank
    per_rank = run_threaded(tp, _compare, op, shape, dtype, False, True, tilings)
    _check(per_rank, op, dtype, tilings)


@pytest.mark.parametrize("op", OPS)
def test_square_weight_follows_the_flag(op: str) -> None:
    """A square weight is never re-interpreted from its shape: the flag alone decides."""
    tilings = TILINGS[op[:2]]
    shape = (24, 32, 32)
    per_rank = run_threaded(2, _compare, op, shape, torch.float32, True, False, tilings)
    _check(per_rank, op, torch.float32, tilings)
    # ... and the flag really changes the result for this (non-symmetric) weight.
    flipped = run_threaded(2, _compare, op, shape, torch.float32, False, False, [None])
    assert not torch.allclose(per_rank[0][0], flipped[0][0], atol=1e-3)


def _bias_only(rank: int, tp: int, op: str) -> list:
    x = torch.zeros(8, 16)
    w = torch.randn(16, 8)
    b = torch.arange(8, dtype=torch.float32) + 1
    split = [1, 1] if op == "rs" else [1, 7]  # rs tiles m/tp = 2 rows
    outs = [_fused(op, x, w, b, False, blocks)[0] for blocks in (None, split)]
    if op in ("ar", "rs"):
        outs.append(_fused(op, x, w, b, False, split, deterministic=True)[0])
    return [(out, b) for out in outs]


@pytest.mark.parametrize("op", OPS)
def test_bias_is_added_exactly_once(op: str) -> None:
    for results in run_threaded(4, _bias_only, op):
        for out, b in results:
            assert torch.equal(out, b.expand_as(out)), out


def _planned_blocks(rank: int, tp: int, m: int) -> list:
    x, w, _ = _inputs(rank, m, 8, 16, torch.float32, False, False)
    return fused.matmul_all_reduce(x, w, group=dist.group.WORLD).shape


def test_blocks_none_executes_the_default_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = overlap.matmul_all_reduce

    def spy(x, matmul, blocks, group, **kwargs):
        seen.append(tuple(blocks))
        return real(x, matmul, blocks, group, **kwargs)

    monkeypatch.setattr(overlap, "matmul_all_reduce", spy)
    run_threaded(2, _planned_blocks, 600)
    assert seen == [(256, 256, 88)] * 2


def test_default_blocks() -> None:
    assert portable.default_blocks(1) == (1,)
    assert portable.default_blocks(255) == (255,)
    assert portable.default_blocks(256) == (128, 128)
    assert portable.default_blocks(600) == (256, 256, 88)
    assert portable.default_blocks(4096) == (1024,) * 4
    for rows in (1, 100, 256, 257, 1000, 5000):
        assert sum(portable.default_blocks(rows)) == rows


def test_cost_models_drive_the_plan() -> None:
    portable.set_cost_models(load_costs(SEED_COSTS_FILE))
    try:
        # The seed's worked example, for the all-reduce (m rows) and per rank of a TP=2 reduce-scatter.
        assert portable.plan(4096, 1, 3072, 8192, 2) == (512, 896, 896, 896, 896)
        assert portable.plan(2048, 2, 3072, 8192, 2) == (256, 448, 448, 448, 448)
        assert sum(portable.plan(1000, 3, 3072, 8192, 2)) == 1000
    finally:
        portable.set_cost_models(None)
    assert portable.plan(4096, 1, 3072, 8192, 2) == portable.default_blocks(4096)


# --------------------------------------------------------------------------- real gloo processes


def _gloo_case(rank: int, tp: int) -> list:
    checks = []
    for op, shape, tilings in (
        ("ar", (40, 48, 32), [None, [9, 1, 30], [20, 20]]),
        ("rs", (40, 48, 32), [None, [1, 19], [7, 13]]),
        ("ag2", (20, 48, 32), [None, [1, 19], [7, 6, 7]]),
    ):
        checks.append((op, tilings, _compare(rank, tp, op, shape, torch.float16, True, True, tilings)))
    return checks


def test_async_gloo_processes() -> None:
    pool = GlooPool(2)
    try:
        per_rank = pool.run(_gloo_case)
    finally:
        pool.close()
    for i, (op, tilings, _) in enumerate(per_rank[0]):
        _check([checks[i][2] for checks in per_rank], op, torch.float16, tilings)


# --------------------------------------------------------------------------- argument errors


def _attempt(rank: int, tp: int, op: str, overrides: dict):
    args = {"x": torch.zeros(8, 16), "w": torch.zeros(16, 4), "bias": None,
            "group": dist.group.WORLD, "transpose_weight": False, "blocks": None}
    args.update(overrides)
    fn = {"ar": fused.matmul_all_reduce, "rs": fused.matmul_reduce_scatter,
          "ag": fused.all_gather_matmul, "ag2": fused.all_gather_matmul_v2}[op]
    try:
        fn(args.pop("x"), args.pop("w"), args.pop("bias"), **args)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        dist.barrier()  # every rank raised before any collective: the group is still usable
        return type(exc), str(exc)
    return None, "no error"


ERRORS = {
    "x not a tensor": ("ar", {"x": [[1.0]]}, CoCArgumentError, "x must be a tensor"),
    "w not a tensor": ("ar", {"w": "weights"}, CoCArgumentError, "w must be a tensor"),
    "x 1-D": ("rs", {"x": torch.zeros(16)}, CoCArgumentError, "x must be 2-D"),
    "w 3-D": ("ag", {"w": torch.zeros(2, 16, 4)}, CoCArgumentError, "w must be 2-D"),
    "x integer": ("ar", {"x": torch.zeros(8, 16, dtype=torch.int32)}, CoCArgumentError, "x has dtype"),
    "k mismatch": ("ar", {"w": torch.zeros(4, 16)}, CoCArgumentError, "transpose_weight=False"),
    "k mismatch transposed": (
        "ag2", {"w": torch.zeros(16, 4), "transpose_weight": True}, CoCArgumentError,
        "transpose_weight=True"),
    "w dtype": ("rs", {"w": torch.zeros(16, 4, dtype=torch.float16)}, CoCArgumentError, "w has dtype"),
    "int8 w outside all-reduce": (
        "rs", {"w": torch.zeros(16, 4, dtype=torch.int8)}, CoCArgumentError, "w has dtype"),
    "bias shape": ("ar", {"bias": torch.zeros(5)}, CoCArgumentError, "bias must have shape"),
    "bias dtype": ("ag", {"bias": torch.zeros(4, dtype=torch.float16)}, CoCArgumentError, "bias has dtype"),
    "bias not a tensor": ("rs", {"bias": 1.0}, CoCArgumentError, "bias must be a tensor"),
    "empty m": ("ar", {"x": torch.zeros(0, 16)}, CoCArgumentError, "empty"),
    "transpose_weight not bool": ("ar", {"transpose_weight": 1}, CoCArgumentError, "transpose_weight"),
    "deterministic not bool": ("rs", {"deterministic": "yes"}, CoCArgumentError, "deterministic"),
    "group missing": ("ag", {"group": None}, CoCArgumentError, "group"),
    "unknown backend": ("ar", {"backend": "cuda"}, CoCArgumentError, "backend"),
    "blocks with atb": ("ar", {"backend": "atb", "blocks": [8]}, CoCArgumentError, "blocks"),
    "blocks sum": ("ar", {"blocks": [4, 3]}, CoCShapeError, "sum to 7"),
    "blocks zero": ("ag", {"blocks": [8, 0]}, CoCShapeError, "positive"),
    "blocks negative": ("ar", {"blocks": [10, -2]}, CoCShapeError, "positive"),
    "blocks bool": ("ar", {"blocks": [True] * 8}, CoCShapeError, "positive"),
    "blocks empty": ("ag2", {"blocks": []}, CoCShapeError, "positive"),
    "blocks not a sequence": ("ar", {"blocks": 8}, CoCShapeError, "sequence"),
    "rs m not divisible by tp": ("rs", {"x": torch.zeros(7, 16)}, CoCShapeError, "tp=2"),
    "rs blocks tile m instead of m/tp": ("rs", {"blocks": [8]}, CoCShapeError, "m/tp"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_argument_errors_on_every_rank(case: str) -> None:
    op, overrides, exc_type, text = ERRORS[case]
    for got_type, message in run_threaded(2, _attempt, op, overrides):
        assert got_type is exc_type, message
        assert text in message


def _attempt_every_case(rank: int, tp: int, backends: tuple[str, ...]) -> list:
    """Every bad call of ERRORS with each backend (unless the case names one), then one good call."""
    results = []
    for case in sorted(ERRORS):
        op, overrides, _, _ = ERRORS[case]
        for backend in backends if "backend" not in overrides else (overrides["backend"],):
            results.append((case, backend, *_attempt(rank, tp, op, {"backend": backend, **overrides})))
    results.append(("valid", "portable", *_attempt(rank, tp, "rs", {"blocks": [1, 3]})))
    return results


def test_bad_arguments_are_refused_before_any_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """One validation, in the front door: no backend is chosen, loaded or run for a bad call."""
    touched = []

    def spy(name: str):
        def record(*args):
            touched.append((name, args))
            raise RuntimeError(f"{name} reached")  # the error the valid call must end with
        return record

    monkeypatch.setattr(portable, "run", spy("portable.run"))
    monkeypatch.setattr(ascend, "run", spy("ascend.run"))
    monkeypatch.setattr(ascend, "check", spy("ascend.check"))
    monkeypatch.setattr(npu_runtime, "load", spy("npu_runtime.load"))
    monkeypatch.setattr(npu_runtime, "is_available", spy("npu_runtime.is_available"))
    for results in run_threaded(2, _attempt_every_case, ("portable", "atb", "auto")):
        *refused, (_, _, valid_type, valid_message) = results
        for case, backend, got_type, message in refused:
            assert got_type is ERRORS[case][2], (case, backend, message)
            assert ERRORS[case][3] in message, (case, backend, message)
        assert (valid_type, valid_message) == (RuntimeError, "portable.run reached")
    # Only the valid call (once per rank) got past the validation, as one ValidatedCall.
    assert [name for name, _ in touched] == ["portable.run"] * 2
    for _, (call,) in touched:
        assert isinstance(call, ValidatedCall) and call.op == "matmul_reduce_scatter"
        assert call.blocks == (1, 3)


def test_the_call_object_holds_what_a_backend_needs() -> None:
    group = dist.ProcessGroup(1, 4)  # a rank of a TP group of 4, as the validation sees it
    x, w, b = torch.zeros(8, 16), torch.zeros(4, 16), torch.zeros(4)
    call = ValidatedCall.validate("matmul_reduce_scatter", x, w, b, group=group, transpose_weight=True,
                                 deterministic=True, blocks=[1, 1])
    assert (call.op, call.m, call.k, call.n, call.tp, call.tiled_rows) == ("matmul_reduce_scatter", 8, 16, 4, 4, 2)
    assert call.x is x and call.w is w and call.bias is b and call.group is group
    assert call.transpose_weight and call.deterministic and call.antiquant is None and call.blocks == (1, 1)
    with pytest.raises(AttributeError):
        call.blocks = None  # frozen: a backend cannot alter what was validated
    gather = ValidatedCall.validate("all_gather_matmul", x, w.t(), group=group)
    assert (gather.m, gather.k, gather.n, gather.tiled_rows, gather.blocks) == (8, 16, 4, 8, None)
    with pytest.raises(CoCArgumentError, match="op must be one of"):
        ValidatedCall.validate("matmul", x, w.t(), group=group)


@pytest.mark.skipif(npu_runtime.is_available(), reason="an Ascend device is present")
def test_atb_without_ascend_says_why() -> None:
    got_type, message = run_threaded(2, _attempt, "ar", {"x": torch.zeros(8, 16, dtype=torch.float16),
                                                         "w": torch.zeros(16, 4, dtype=torch.float16),
                                                         "backend": "atb"})[0]
    assert got_type is CoCBackendUnavailable
    assert npu_runtime.unavailable_reason() in message


def test_auto_falls_back_to_portable() -> None:
    """float32 on CPU tensors: no MC2 kernel takes it, with or without an NPU here."""
    per_rank = run_threaded(2, _compare, "ar", (24, 16, 8), torch.float32, False, True, [None])
    auto = run_threaded(2, _attempt_auto)
    for (ref, _, _), out in zip(per_rank, auto, strict=True):
        assert torch.allclose(out, ref, atol=1e-5)


def _attempt_auto(rank: int, tp: int) -> torch.Tensor:
    x, w, b = _inputs(rank, 24, 16, 8, torch.float32, False, True)
    return fused.matmul_all_reduce(x, w, b, group=dist.group.WORLD, backend="auto")


def test_fused_flag_keeps_tp8() -> None:
    fused.check_fused_tp(8)
    for tp in (1, 2, 4, 16):
        with pytest.raises(CoCFusedTPError, match="8"):
            fused.check_fused_tp(tp)
