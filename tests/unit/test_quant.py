"""w8A16 pseudo-quantisation: dequantisation numerics and argument validation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from coc_impl import fused
from coc_impl.errors import CoCArgumentError
from coc_impl.quant import check_antiquant, dequantize
from coc_impl.validated_call import ValidatedCall
from tests.support.dist_helpers import run_threaded

K, N, G = 80, 24, 32  # k not a multiple of g: the last group is a partial one
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _scale_shape(granularity: str) -> tuple[int, ...]:
    return {"tensor": (1,), "channel": (N,), "group": (math.ceil(K / G), N)}[granularity]


def _quant_args(granularity: str, with_offset: bool, dtype: torch.dtype, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    shape = _scale_shape(granularity)
    scale = (torch.rand(shape, generator=gen) * 0.02 + 0.005).to(dtype)
    offset = (torch.randn(shape, generator=gen) * 3).to(dtype) if with_offset else None
    return {
        "antiquant_scale": scale,
        "antiquant_offset": offset,
        "antiquant_group_size": G if granularity == "group" else 0,
    }


def _int8_weight(seed: int, transpose: bool) -> torch.Tensor:
    w = torch.randint(-128, 128, (K, N), dtype=torch.int8, generator=torch.Generator().manual_seed(seed))
    return w.t().contiguous() if transpose else w


def _fp64_dequant(w_kn: torch.Tensor, args: dict) -> torch.Tensor:
    """Independent reference: loop over the rows of the logical [k, n] weight."""
    scale = args["antiquant_scale"].double()
    offset = args["antiquant_offset"]
    offset = torch.zeros_like(scale) if offset is None else offset.double()
    g = args["antiquant_group_size"]
    out = torch.empty(w_kn.shape, dtype=torch.float64)
    for row in range(w_kn.shape[0]):
        i = row // g if g else 0
        s = scale[i] if scale.dim() == 2 else scale
        o = offset[i] if offset.dim() == 2 else offset
        out[row] = (w_kn[row].double() + o) * s
    return out


GRANULARITIES = ["tensor", "channel", "group"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("with_offset", [False, True])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_dequantize_matches_fp64(granularity: str, with_offset: bool, transpose: bool,
                                 dtype: torch.dtype) -> None:
    w = _int8_weight(1, transpose)
    x = torch.zeros(4, K, dtype=dtype)
    args = _quant_args(granularity, with_offset, dtype)
    aq = check_antiquant(
        x, w, args["antiquant_scale"], args["antiquant_offset"], args["antiquant_group_size"],
        transpose_weight=transpose,
    )
    assert aq is not None and aq.granularity == granularity
    dq = dequantize(w, aq, transpose_weight=transpose)
    assert dq.dtype == dtype and dq.shape == w.shape
    dq_kn = dq.t() if transpose else dq
    ref = _fp64_dequant(w.t() if transpose else w, args)
    err = (dq_kn.double() - ref).abs()
    assert torch.all(err <= EPS[dtype] * ref.abs() + 1e-7), err.max()


def _run_quant_all_reduce(rank: int, world: int, granularity: str, with_offset: bool,
                          dtype: torch.dtype, transpose: bool, deterministic: bool) -> tuple:
    torch.manual_seed(100 + rank)
    x = (torch.randn(40, K) * 0.5).to(dtype)
    w = _int8_weight(10 + rank, transpose)
    args = _quant_args(granularity, with_offset, dtype, seed=20 + rank)
    out = fused.matmul_all_reduce(
        x, w, group=dist.group.WORLD, transpose_weight=transpose, deterministic=deterministic,
        blocks=[16, 7, 17], **args,
    )
    aq = check_antiquant(x, w, args["antiquant_scale"], args["antiquant_offset"],
                         args["antiquant_group_size"], transpose_weight=transpose)
    plain = fused.matmul_all_reduce(
        x, dequantize(w, aq, transpose_weight=transpose), group=dist.group.WORLD,
        transpose_weight=transpose, deterministic=deterministic, blocks=[16, 7, 17],
    )
    w_kn = w.t() if transpose else w
    partial64 = x.double() @ _fp64_dequant(w_kn, args)
    bound = x.double().abs() @ _fp64_dequant(w_kn, args).abs()
    return out, plain, partial64, bound


@pytest.mark.parametrize(
    "granularity,with_offset,dtype,transpose,deterministic",
    [
        ("tensor", False, torch.float16, False, False),
        ("tensor", True, torch.bfloat16, True, True),
        ("channel", False, torch.bfloat16, False, True),
        ("channel", True, torch.float16, True, False),
        ("group", False, torch.float16, True, True),
        ("group", True, torch.float16, False, False),
        ("group", True, torch.bfloat16, False, True),
    ],
)
def test_quantised_matmul_all_reduce(granularity, with_offset, dtype, transpose, deterministic) -> None:
    results = run_threaded(
        2, _run_quant_all_reduce, granularity, with_offset, dtype, transpose, deterministic
    )
    ref = sum(r[2] for r in results)
    bound = sum(r[3] for r in results)
    for out, plain, _, _ in results:
        assert out.dtype == dtype and out.shape == (40, N)
        # Quantisation is orthogonal: the op on the int8 weight is the op on its dequantised weight.
        assert torch.equal(out, plain)
        err = (out.double() - ref).abs()
        assert torch.all(err <= 6 * EPS[dtype] * bound + 1e-6), (err / bound).max()


def _base(dtype: torch.dtype = torch.float16, transpose: bool = False) -> dict:
    return {
        "x": torch.zeros(8, K, dtype=dtype),
        "w": _int8_weight(0, transpose),
        "transpose_weight": transpose,
        **_quant_args("channel", True, torch.float16),
    }


def _with(**changes) -> dict:
    args = _base()
    args.update(changes)
    return args


BAD_ARGS = {
    "offset without scale": (_with(antiquant_scale=None), "antiquant_offset"),
    "group size without scale": (
        _with(antiquant_scale=None, antiquant_offset=None, antiquant_group_size=32), "antiquant_group_size"),
    "int8 weight without scale": (_with(antiquant_scale=None, antiquant_offset=None), "antiquant_scale"),
    "scale with float weight": (_with(w=torch.zeros(K, N, dtype=torch.float16)), "w has dtype"),
    "int8 weight with fp32 x": (
        _with(x=torch.zeros(8, K), antiquant_scale=torch.ones(N), antiquant_offset=None), "x has dtype"),
    "scale dtype": (_with(antiquant_scale=torch.ones(N, dtype=torch.float32)), "antiquant_scale"),
    "scale not a tensor": (_with(antiquant_scale=0.5), "antiquant_scale"),
    "scale shape": (_with(antiquant_scale=torch.ones(N + 1, dtype=torch.float16)), "antiquant_scale"),
    "scale is [k] not [n]": (
        _with(antiquant_scale=torch.ones(K, dtype=torch.float16), antiquant_offset=None), "antiquant_scale"),
    "2-D scale without group size": (
        _with(antiquant_scale=torch.ones(3, N, dtype=torch.float16), antiquant_offset=None),
        "antiquant_scale"),
    "group size with a per-channel scale": (_with(antiquant_group_size=32), "antiquant_group_size"),
    "group size not a multiple of 32": (
        _with(antiquant_scale=torch.ones(2, N, dtype=torch.float16), antiquant_offset=None,
              antiquant_group_size=40), "antiquant_group_size"),
    "group size below 32": (
        _with(antiquant_scale=torch.ones(5, N, dtype=torch.float16), antiquant_offset=None,
              antiquant_group_size=16), "antiquant_group_size"),
    "group size not below k": (
        _with(antiquant_scale=torch.ones(1, N, dtype=torch.float16), antiquant_offset=None,
              antiquant_group_size=96), "antiquant_group_size"),
    "negative group size": (_with(antiquant_group_size=-32), "antiquant_group_size"),
    "group size not an int": (_with(antiquant_group_size=32.0), "antiquant_group_size"),
    "per-group scale rows": (
        _with(antiquant_scale=torch.ones(2, N, dtype=torch.float16), antiquant_offset=None,
              antiquant_group_size=32), "antiquant_scale"),
    "offset shape": (_with(antiquant_offset=torch.ones(1, dtype=torch.float16)), "antiquant_offset"),
    "offset dtype": (_with(antiquant_offset=torch.ones(N, dtype=torch.bfloat16)), "antiquant_offset"),
    # With transpose_weight the [n, k] storage must not be read as [k, n].
    "per-channel scale of the storage's first dim": (
        {**_base(transpose=True), "antiquant_scale": torch.ones(K, dtype=torch.float16),
         "antiquant_offset": None}, "antiquant_scale"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_argument_errors_name_the_argument(case: str) -> None:
    args, name = BAD_ARGS[case]
    with pytest.raises(CoCArgumentError) as info:
        check_antiquant(
            args["x"], args["w"], args["antiquant_scale"], args["antiquant_offset"],
            args["antiquant_group_size"], transpose_weight=args["transpose_weight"],
        )
    assert name in str(info.value)


def _raise_on_every_rank(rank: int, world: int, case: str) -> str:
    args = dict(BAD_ARGS[case][0])  # shared between the rank threads: copy before popping
    x = args.pop("x")
    w = args.pop("w")
    try:
        fused.matmul_all_reduce(x, w, group=dist.group.WORLD, **args)
    except CoCArgumentError as exc:
        # The peer must not be left waiting in a collective: one more collective proves it.
        dist.barrier()
        return str(exc)
    return "no error"


@pytest.mark.parametrize(
    "case", ["int8 weight with fp32 x", "group size with a per-channel scale", "offset shape"]
)
def test_errors_raise_on_every_rank_before_any_collective(case: str) -> None:
    messages = run_threaded(2, _raise_on_every_rank, case)
    assert all(m != "no error" and m == messages[0] for m in messages)


def test_unquantised_call_needs_no_antiquant() -> None:
    x, w = torch.zeros(4, K, dtype=torch.float16), torch.zeros(K, N, dtype=torch.float16)
    assert check_antiquant(x, w, None, None, 0, transpose_weight=False) is None


def test_the_validated_call_carries_the_antiquant() -> None:
    """The front door validates the antiquant once; the call keeps the int8 weight for the backend."""
    group = dist.ProcessGroup(0, 2)
    args = _quant_args("group", True, torch.float16)
    x, w = torch.zeros(8, K, dtype=torch.float16), _int8_weight(0, transpose=True)
    call = ValidatedCall.validate("matmul_all_reduce", x, w, group=group, transpose_weight=True, **args)
    aq = call.antiquant
    assert call.w is w and (call.k, call.n) == (K, N)
    assert aq is not None and aq.granularity == "group" and aq.group_size == G and aq.dtype == torch.float16
    assert aq.scale is args["antiquant_scale"] and aq.offset is args["antiquant_offset"]


@pytest.mark.parametrize("op", ["matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2"])
def test_antiquant_is_for_matmul_all_reduce_only(op: str) -> None:
    x = torch.zeros(8, K, dtype=torch.float16)
    w = torch.zeros(K, N, dtype=torch.float16)
    with pytest.raises(CoCArgumentError, match="matmul_all_reduce only"):
        ValidatedCall.validate(op, x, w, group=dist.ProcessGroup(0, 2), antiquant_scale=torch.ones(1))
