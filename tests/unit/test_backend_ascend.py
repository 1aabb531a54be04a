"""Ascend backend: honest unavailability, host-side validation, the MC2 binding held
to torch_npu's published contract, and device numerics over HCCL ranks (skipped
without NPUs).

The binding is exercised against :mod:`tests.support.mc2_stand_in`: torch_npu's three
MC2 signatures defined with ``torch.library`` (so torch's argument parser
checks every call) and CPU kernels that assert the documented limits and
compute the documented result.  The backend takes a call validated by
:meth:`coc_impl.validated_call.ValidatedCall.validate`; the generic argument
errors are checked through the front door with ``backend="atb"``, which must
refuse them before the backend is reached."""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.abc
import importlib.util
import logging
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import coc_impl.backends as backends
from coc_impl import fused
from coc_impl.backends import ascend, mc2_limits, npu_runtime, portable
from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable, CoCShapeError
from coc_impl.quant import dequantize
from coc_impl.validated_call import ValidatedCall
from tests.support import mc2_stand_in as stand_in
from tests.support.mc2_stand_in import A2_SOC, A3_SOC, FakeGroup, FakeTorchNpu, Refused

requires_npu = pytest.mark.skipif(not npu_runtime.is_available(), reason=str(npu_runtime.unavailable_reason()))
without_npu = pytest.mark.skipif(npu_runtime.is_available(), reason="an NPU is usable here")

F16, BF16 = torch.float16, torch.bfloat16
AR, RS, AG, AG2 = fused.OPS
FAMILY = {A2_SOC: "Atlas A2", A3_SOC: "Atlas A3"}


# --------------------------------------------------------------------------- stand-in


def _install(monkeypatch, fake: FakeTorchNpu, ops) -> FakeTorchNpu:
    """``fake`` as torch_npu, ``ops`` as ``torch.ops.npu``; CPU tensors stand for NPU ones."""
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch.ops, "npu", ops)
    monkeypatch.setattr(npu_runtime, "npu_device", lambda index=None: torch.device("cpu", index))
    monkeypatch.setattr(mc2_limits, "_domain", None)
    monkeypatch.setattr(dist, "get_global_rank", lambda group, rank: 8 + rank)
    npu_runtime._probe.cache_clear()
    return fake


@pytest.fixture
def fake_npu(monkeypatch):
    """An Atlas A2 host with 8 NPUs and torch_npu 2.13.0's MC2 ops; the probe cache is reset around it."""
    yield _install(monkeypatch, FakeTorchNpu(), stand_in.OPS)
    npu_runtime._probe.cache_clear()


@pytest.fixture
def on_soc(monkeypatch):
    """Like :func:`fake_npu`, on the SoC given."""
    yield lambda soc, ops=stand_in.OPS: _install(monkeypatch, FakeTorchNpu(soc=soc), ops)
    npu_runtime._probe.cache_clear()


def _operands(m=8, k=256, n=256, dtype=F16, transposed=False):
    x = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k).to(dtype) if transposed else torch.randn(k, n).to(dtype)
    return x, w, torch.randn(n).to(dtype)


def _run(op, *args, **kwargs):
    """The backend on one validated call of ``op``."""
    return ascend.run(ValidatedCall.validate(op, *args, **kwargs))


#: The backend's entry per op, and the front door choosing it.
OPS = {name: functools.partial(_run, name) for name in fused.OPS}
ATB = {name: functools.partial(getattr(fused, name), backend="atb") for name in fused.OPS}
AUTO = {name: functools.partial(getattr(fused, name), backend="auto") for name in fused.OPS}


def _expected(op, x, w_kn, bias, group):
    """The documented result of the stand-in's collective model, bias added once in the output dtype."""
    tp, rank = group.size(), group.rank()
    if op == AR:
        out = tp * (x.float() @ w_kn.float())
    elif op == RS:
        rows = x.shape[0] // tp
        out = tp * (x[rank * rows:(rank + 1) * rows].float() @ w_kn.float())
    else:
        out = x.repeat(tp, 1).float() @ w_kn.float()
    out = out.to(x.dtype)
    return out if bias is None else out + bias


# --------------------------------------------------------------------------- CPU honesty


def test_import_does_not_import_torch_npu(monkeypatch):
    """Importing the backend must not even try to import torch_npu."""
    attempts: list[str] = []

    class Recorder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "torch_npu":
                attempts.append(name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Recorder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    modules = {"npu_runtime": npu_runtime, "mc2_limits": mc2_limits, "ascend": ascend}
    for name in modules:
        monkeypatch.delitem(sys.modules, f"coc_impl.backends.{name}")
    try:
        importlib.import_module("coc_impl.backends.ascend")
    finally:
        for name, module in modules.items():  # keep the package attributes on the modules under test
            setattr(backends, name, module)
    assert attempts == []
    assert "torch_npu" not in sys.modules


@without_npu
def test_unavailable_with_an_honest_reason():
    assert npu_runtime.is_available() is False
    reason = npu_runtime.unavailable_reason()
    assert reason
    if importlib.util.find_spec("torch_npu") is None:
        assert reason.startswith("torch_npu is not importable: ")


@without_npu
@pytest.mark.parametrize("entry", [OPS, ATB], ids=["backend", "front door"])
@pytest.mark.parametrize("name", OPS)
def test_ops_raise_unavailable_with_the_reason(name, entry):
    x, w, bias = _operands()
    with pytest.raises(CoCBackendUnavailable, match="torch_npu|NPU") as info:
        entry[name](x, w, bias, group=FakeGroup())
    assert npu_runtime.unavailable_reason() in str(info.value)


@without_npu
def test_rank_set_up_needs_the_runtime():
    with pytest.raises(CoCBackendUnavailable):
        npu_runtime.init_process_group_kwargs()
    with pytest.raises(CoCBackendUnavailable):
        npu_runtime.bind_device(0)


def test_visible_devices_env():
    assert npu_runtime.visible_devices_env([2, 3]) == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    assert npu_runtime.visible_devices_env(range(1)) == {"ASCEND_RT_VISIBLE_DEVICES": "0"}
    for bad in ([], [1, 1], [-1], [True], ["2"]):
        with pytest.raises(CoCArgumentError):
            npu_runtime.visible_devices_env(bad)


# --------------------------------------------------------------------------- validation on CPU


def _int8(k=256, n=256):
    return torch.randint(-128, 128, (k, n), dtype=torch.int8)


def _x(m=8, k=256, dtype=F16):
    return torch.randn(m, k).to(dtype)


G = FakeGroup()
AR_ATB = ATB[AR]


def _aq(scale_shape, group_size=0, offset_shape=None, dtype=F16):
    """matmul_all_reduce of an int8 [256, 256] weight with these antiquant arguments."""
    offset = None if offset_shape is None else torch.ones(offset_shape, dtype=F16)
    return lambda: AR_ATB(_x(), _int8(), group=G, antiquant_scale=torch.ones(scale_shape, dtype=dtype),
                          antiquant_offset=offset, antiquant_group_size=group_size)


#: Refused by the front door's single validation, whatever the backend.
INVALID = {
    "x 3-D": (lambda: AR_ATB(_x().view(2, 4, 256), _x(256, 256), group=G), "x must be 2-D"),
    "int8 w, float32 x": (lambda: AR_ATB(_x(dtype=torch.float32), _int8(), group=G,
                                         antiquant_scale=torch.ones(1)), "w8A16"),
    "w dtype": (lambda: AR_ATB(_x(), _x(256, 256, BF16), group=G), "must match"),
    "k mismatch": (lambda: AR_ATB(_x(), _x(128, 256), group=G), "w's k=128"),
    "k mismatch transposed": (lambda: AR_ATB(_x(), _x(256, 128), group=G, transpose_weight=True),
                              r"\[n, k\].*w's k=128"),
    "transpose flag": (lambda: AR_ATB(_x(), _x(256, 256), group=G, transpose_weight=1), "must be True or False"),
    "empty": (lambda: AR_ATB(_x(0), _x(256, 256), group=G), "empty"),
    "bias shape": (lambda: AR_ATB(_x(), _x(256, 128), torch.zeros(1, 128, dtype=F16), group=G),
                   r"bias must have shape \[n=128\]"),
    "bias dtype": (lambda: AR_ATB(_x(), _x(256, 128), torch.zeros(128), group=G), "bias has dtype"),
    "int8 without scale": (lambda: AR_ATB(_x(), _int8(), group=G), "antiquant_scale is missing"),
    "scale without int8": (lambda: AR_ATB(_x(), _x(256, 256), group=G,
                                          antiquant_scale=torch.ones(1, dtype=F16)), "w8A16 needs an int8 w"),
    "group size not /32": (_aq((6, 256), 48), "multiple of 32"),
    "group size >= k": (_aq((1, 256), 256), "antiquant_group_size < k=256"),
    "per-group shape": (_aq((4, 256), 32), r"\[ceil\(k/g\), n\] = \[8, 256\]"),
    "per-channel shape": (_aq((255,)), "per-channel"),
    "offset shape": (_aq((256,), offset_shape=(1,)), "antiquant_offset has shape"),
    "scale dtype": (_aq((256,), dtype=BF16), "antiquant_scale has dtype"),
    "int8 reduce-scatter": (lambda: ATB[RS](_x(), _int8(), group=G), "matmul_all_reduce only"),
    "int8 all-gather": (lambda: ATB[AG](_x(), _int8(), group=G), "matmul_all_reduce only"),
    "no group": (lambda: AR_ATB(_x(), _x(256, 256), group=None), "group must be the tensor-parallel ProcessGroup"),
    "not a member": (lambda: AR_ATB(_x(), _x(256, 256), group=FakeGroup(rank=-1)), "not a member"),
}


@pytest.fixture
def backend_spy(fake_npu, monkeypatch):
    """The Ascend backend as the front door would reach it (available), recording every entry."""
    reached = []
    monkeypatch.setattr(ascend, "run", lambda call: reached.append(call))
    monkeypatch.setattr(portable, "run", lambda call: reached.append(call))
    return reached


@pytest.mark.parametrize("case", INVALID)
def test_invalid_arguments_fail_before_the_backend(backend_spy, fake_npu, case):
    call, match = INVALID[case]
    with pytest.raises(CoCArgumentError, match=match):
        call()
    assert backend_spy == [] and fake_npu.calls == []


def test_reduce_scatter_rows_must_split_over_tp(backend_spy):
    x, w, _ = _operands(m=6)
    with pytest.raises(CoCShapeError, match=r"m=6.*tp=4"):
        ATB[RS](x, w, group=FakeGroup(size=4))
    assert backend_spy == []


@pytest.mark.parametrize("name", OPS)
def test_mc2_activation_dtypes_are_checked_before_the_runtime(name):
    """float32 is a valid call, but not for MC2: said on the host, before torch_npu is asked for."""
    x, w, _ = _operands(dtype=torch.float32)
    with pytest.raises(CoCArgumentError, match="x must be float16 or bfloat16 on Ascend, got torch.float32"):
        OPS[name](x, w, group=G)


# --------------------------------------------------------------------------- the contract and its stand-in


def test_the_binding_keeps_the_contracts_limits():
    """The binding's limits are the ones recorded with their sources in the contract (npu_sim/mc2_contract.toml)."""
    assert {name: (codes.start, codes.stop - 1) for name, codes in npu_runtime.SOC_FAMILIES.items()} == {
        name: tuple(span) for name, span in stand_in.CONTRACT["soc"].items()}
    for op, limits in mc2_limits.LIMITS.items():
        recorded = stand_in.LIMITS[limits.kernel]
        assert limits.doc == recorded["doc"], op
        assert {family: sorted(sizes) for family, sizes in limits.tp.items()} == recorded["tp"], op
        assert limits.k_range == (tuple(recorded["k"]) if "k" in recorded else None), op
        assert sorted(limits.one_domain) == recorded["one_domain"], op
    w8a16 = stand_in.LIMITS["npu_mm_all_reduce_base"]["w8a16"]
    assert (w8a16["doc"], w8a16["max_kn"]) == (mc2_limits.W8A16_DOC, mc2_limits.W8A16_MAX_KN)
    assert set(npu_runtime.MC2_OPS) == set(stand_in.SCHEMAS)


def test_the_stand_in_is_the_published_schema():
    for kernel, line in stand_in.SCHEMAS.items():
        defined = getattr(stand_in.OPS, kernel).default._schema
        assert str(defined) == str(torch._C.parse_schema(f"{stand_in.NAMESPACE}::{line}"))


def _x_w():
    return _x(8), _x(256, 256)


#: Calls torch's parser refuses against the published schemas: the kernel is never entered.
REFUSED_BY_SCHEMA = {
    "misnamed first argument": (lambda x, w: torch.ops.npu.npu_all_gather_base_mm(
        x1=x, x2=w, hcom="hcom-tp", world_size=4), "missing value for argument 'self'"),
    "misspelt keyword": (lambda x, w: torch.ops.npu.npu_mm_all_reduce_base(
        x, w, "hcom-tp", reduce_ops="sum"), "Unknown keyword argument 'reduce_ops'"),
    "argument of another kernel": (lambda x, w: torch.ops.npu.npu_mm_reduce_scatter_base(
        x, w, "hcom-tp", 4, antiquant_scale=x), "Unknown keyword argument 'antiquant_scale'"),
    "missing world_size": (lambda x, w: torch.ops.npu.npu_mm_reduce_scatter_base(
        x, w, "hcom-tp"), "missing value for argument 'world_size'"),
    "keyword-only given positionally": (lambda x, w: torch.ops.npu.npu_mm_all_reduce_base(
        x, w, "hcom-tp", "sum"), "positional argument"),
    "wrong type": (lambda x, w: torch.ops.npu.npu_all_gather_base_mm(
        x, w, "hcom-tp", 4.0), "Expected a value of type 'int' for argument 'world_size'"),
}


@pytest.mark.parametrize("case", REFUSED_BY_SCHEMA)
def test_the_stand_in_refuses_what_the_schema_does(fake_npu, case):
    call, match = REFUSED_BY_SCHEMA[case]
    with pytest.raises(RuntimeError, match=match):
        call(*_x_w())
    assert fake_npu.calls == []


def _direct(kernel, *args, **kwargs):
    group = FakeGroup()
    group._comm_name(0)  # registers domain "hcom-tp", rank 0 of 4, while the group lives
    return getattr(torch.ops.npu, kernel)(*args, **kwargs)


#: Calls the stand-in's kernel refuses as the documentation does (it would otherwise compute garbage or hang).
REFUSED_BY_KERNEL = {
    "bias": (lambda x, w: _direct("npu_mm_all_reduce_base", x, w, "hcom-tp", bias=x[0]), "bias"),
    "world size": (lambda x, w: _direct("npu_mm_reduce_scatter_base", x, w, "hcom-tp", 3), "world_size 3"),
    "k range": (lambda x, w: _direct("npu_all_gather_base_mm", x[:, :128].contiguous(), w[:128], "hcom-tp", 4),
                 "256 <= k"),
    "float32": (lambda x, w: _direct("npu_all_gather_base_mm", x.float(), w.float(), "hcom-tp", 4), "x1 dtype"),
    "strided x2": (lambda x, w: _direct("npu_mm_all_reduce_base", x[:, :128].contiguous(), w[::2], "hcom-tp"),
                   "x2 must be ND"),
    "comm_turn": (lambda x, w: _direct("npu_mm_all_reduce_base", x, w, "hcom-tp", comm_turn=1), "comm_turn"),
    "quantised mode": (lambda x, w: _direct("npu_mm_all_reduce_base", x, w, "hcom-tp", x3=x), "x3"),
    "plain per-group scale, transposed x2": (
        lambda x, w: _direct("npu_mm_all_reduce_base", x, _int8().t().contiguous().t(), "hcom-tp",
                             antiquant_scale=torch.ones(8, 256, dtype=F16), antiquant_group_size=32),
        "transposed with x2"),
}


@pytest.mark.parametrize("case", REFUSED_BY_KERNEL)
def test_the_stand_in_kernel_asserts_the_documented_limits(fake_npu, case):
    call, match = REFUSED_BY_KERNEL[case]
    with pytest.raises(Refused, match=match):
        call(*_x_w())


def _binding_calls():
    """Every kind of call the binding makes, at every TP size the kernels take, on Atlas A2 and A3."""
    for soc in (A2_SOC, A3_SOC):
        for op, limits in mc2_limits.LIMITS.items():
            for tp in sorted(limits.tp.get(FAMILY[soc], ())):
                for transposed in (False, True):
                    yield pytest.param(soc, op, tp, transposed, None, id=f"{FAMILY[soc]}-{op}-tp{tp}-t{transposed:d}")
                    if op != AR:
                        continue
                    for granularity in ("tensor", "channel", "group", "group+offset"):
                        yield pytest.param(soc, op, tp, transposed, granularity,
                                           id=f"{FAMILY[soc]}-{op}-tp{tp}-t{transposed:d}-{granularity}")


def _antiquant(granularity, k=256, n=64, dtype=F16):
    """w8A16 arguments in terms of the logical [k, n] weight; scales of powers of two."""
    pick = lambda *shape: (2.0 ** torch.randint(-6, -2, shape)).to(dtype)  # noqa: E731
    if granularity is None:
        return {}
    shape = {"tensor": (1,), "channel": (n,)}.get(granularity, (k // 64, n))
    args = {"antiquant_scale": pick(*shape)}
    if granularity.startswith("group"):
        args["antiquant_group_size"] = 64
    if granularity.endswith("offset"):
        args["antiquant_offset"] = torch.randint(-4, 4, shape).to(dtype)
    return args


@pytest.mark.parametrize(("soc", "op", "tp", "transposed", "granularity"), list(_binding_calls()))
def test_every_call_the_binding_makes_is_accepted_and_computed(on_soc, soc, op, tp, transposed, granularity):
    """torch's parser accepts the call, the kernel its operands, and the result is the documented one."""
    fake = on_soc(soc)
    k, n = 256, 64
    x = torch.randint(-3, 4, (tp * 2, k)).to(F16)
    aq = _antiquant(granularity, k, n)
    w_kn = torch.randint(-100, 100, (k, n), dtype=torch.int8) if aq else torch.randint(-3, 4, (k, n)).to(F16)
    w = w_kn.t().contiguous() if transposed else w_kn
    bias = torch.randn(n).to(F16)
    group = FakeGroup(rank=tp - 1, size=tp)
    result = ATB[op](x, w, bias, group=group, transpose_weight=transposed, **aq)
    out = result[0] if isinstance(result, tuple) else result
    if aq:
        call = ValidatedCall.validate(op, x, w, group=group, transpose_weight=transposed, **aq)
        w_kn = dequantize(w, call.antiquant, transpose_weight=transposed)
        w_kn = w_kn.t() if transposed else w_kn
    torch.testing.assert_close(out, _expected(op, x, w_kn, bias, group))
    (kernel, bound), = fake.calls
    assert kernel == mc2_limits.LIMITS[op].kernel and bound["bias"] is None
    if op == AG2:
        assert torch.equal(result[1], x.repeat(tp, 1))


# --------------------------------------------------------------------------- binding details


def test_fake_runtime_is_available_and_binds(fake_npu):
    assert npu_runtime.is_available() and npu_runtime.unavailable_reason() is None
    assert npu_runtime.init_process_group_kwargs() == {"backend": "hccl"}
    assert npu_runtime.bind_device(1) == torch.device("cpu", 1)
    assert fake_npu.devices_set == [1]


def test_reasons_name_the_missing_piece(monkeypatch):
    npu_runtime._probe.cache_clear()
    try:
        monkeypatch.setitem(sys.modules, "torch_npu", None)  # import raises ImportError
        assert npu_runtime.unavailable_reason().startswith("torch_npu is not importable: ModuleNotFoundError")
        npu_runtime._probe.cache_clear()
        _install(monkeypatch, FakeTorchNpu(devices=0), stand_in.OPS)
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "5")
        assert npu_runtime.unavailable_reason() == "no NPU device visible (ASCEND_RT_VISIBLE_DEVICES=5)"
        _install(monkeypatch, FakeTorchNpu(), torch.ops.coc_mc2_stand_in_none)  # a namespace with no ops
        reason = npu_runtime.unavailable_reason()
        assert all(kernel in reason for kernel in npu_runtime.MC2_OPS) and "torch.ops.npu" in reason
        with pytest.raises(CoCBackendUnavailable, match="registers no MC2 ops"):
            OPS[AR](*_operands(), group=FakeGroup())
    finally:
        npu_runtime._probe.cache_clear()


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("transpose_weight", [False, True])
def test_weight_is_passed_as_kn_view_never_guessed(fake_npu, name, transpose_weight):
    """Square weights: only the flag can say which way round ``w`` is."""
    x, w, _ = _operands(k=256, n=256, transposed=transpose_weight)
    OPS[name](x, w, group=FakeGroup(), transpose_weight=transpose_weight)
    (_, bound), = fake_npu.calls
    x2 = bound["x2"]
    assert x2.data_ptr() == w.data_ptr()  # a view, never a copy
    assert torch.equal(x2, w.t() if transpose_weight else w)
    assert x2.stride() == ((1, 256) if transpose_weight else (256, 1))


def test_strided_weight_is_made_contiguous(fake_npu):
    x, _, _ = _operands()
    w = torch.randn(256, 512).to(F16)[:, ::2]  # neither ND nor a transposed ND view
    OPS[AR](x, w, group=FakeGroup())
    (_, bound), = fake_npu.calls
    assert bound["x2"].is_contiguous() and torch.equal(bound["x2"], w)


@pytest.mark.parametrize("entry", [OPS, ATB], ids=["backend", "front door"])
@pytest.mark.parametrize("name", OPS)
def test_bias_is_added_once_after_the_kernel(fake_npu, name, entry):
    x, w, bias = _operands()
    group = FakeGroup(size=4)
    result = entry[name](x, w, bias, group=group)
    out = result[0] if isinstance(result, tuple) else result
    (_, bound), = fake_npu.calls
    assert bound.get("x1", bound.get("self")) is x and bound["x2"] is w  # the operands as given
    assert bound["bias"] is None
    torch.testing.assert_close(out, _expected(name, x, w, bias, group))


def test_hcom_and_world_size_come_from_the_group(fake_npu):
    group = FakeGroup(rank=1, size=4, name="tp7")
    x, w, _ = _operands()
    OPS[AR](x, w, group=group)
    OPS[RS](x, w, group=group)
    OPS[AG](x, w, group=group)
    (_, ar), (_, rs), (_, ag) = fake_npu.calls
    assert ar["hcom"] == rs["hcom"] == ag["hcom"] == "hcom-tp7"
    assert group.comm_name_ranks == [9] * 3  # global rank of group rank 1
    assert rs["world_size"] == ag["world_size"] == 4
    assert group.backend_devices == [torch.device("cpu")] * 3
    assert (ar["reduce_op"], ar["comm_turn"], rs["reduce_op"], rs["comm_turn"]) == ("sum", 0, "sum", 0)
    assert (ag["gather_index"], ag["gather_output"], ag["comm_turn"]) == (0, False, 0)


def test_all_gather_v2_returns_the_gathered_input(fake_npu):
    x, w, bias = _operands(m=8)
    group = FakeGroup(size=4)
    out, gathered = OPS[AG2](x, w, bias, group=group)
    assert fake_npu.calls[0][1]["gather_output"] is True
    assert out.shape == (32, 256) and torch.equal(gathered, x.repeat(4, 1))
    assert isinstance(OPS[AG](x, w, group=group), torch.Tensor)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_antiquant_arguments_pass_through(fake_npu, dtype):
    x = _x(dtype=dtype)
    w = _int8()
    scale, offset = torch.rand(8, 256).to(dtype), torch.randn(8, 256).to(dtype)
    OPS[AR](x, w, group=G, antiquant_scale=scale, antiquant_offset=offset, antiquant_group_size=32)
    per_channel = torch.rand(256).to(dtype)
    OPS[AR](x, w, group=G, antiquant_scale=per_channel)
    (_, grouped), (_, channel) = fake_npu.calls
    assert grouped["antiquant_scale"] is scale and grouped["antiquant_offset"] is offset
    assert grouped["antiquant_group_size"] == 32
    assert channel["antiquant_scale"] is per_channel
    assert channel["antiquant_offset"] is None and channel["antiquant_group_size"] == 0


@pytest.mark.parametrize("name", [RS, AG, AG2])
def test_mc2_k_range_is_reported_not_sent(fake_npu, name):
    x, w, _ = _operands(k=128)
    with pytest.raises(CoCBackendUnavailable, match=r"256 <= k < 65535 \(CANN aclnn\w+\), got k=128"):
        OPS[name](x, w, group=FakeGroup())
    assert fake_npu.calls == []


def test_w8a16_size_limit_is_reported_not_sent(fake_npu):
    x, w = _x(8, 256), torch.zeros(256, 65536, dtype=torch.int8)
    with pytest.raises(CoCBackendUnavailable, match=r"k, n <= 65535 \(CANN aclnnWeightQuantMatmulAllReduce\)"):
        OPS[AR](x, w, group=FakeGroup(), antiquant_scale=torch.ones(1, dtype=F16))
    assert fake_npu.calls == []


def test_tensors_off_the_npu_are_refused(fake_npu, monkeypatch):
    monkeypatch.setattr(npu_runtime, "npu_device", lambda index=None: torch.device("meta"))  # "the NPU"
    with pytest.raises(CoCArgumentError, match="takes NPU tensors, x is on cpu"):
        OPS[AR](*_operands()[:2], group=FakeGroup())


# --------------------------------------------------------------------------- issue 24, items 1-8


@pytest.mark.parametrize("offset", [False, True], ids=["scale", "scale+offset"])
@pytest.mark.parametrize("transposed", [False, True], ids=["kn", "nk"])
def test_per_group_scale_takes_the_weights_layout(fake_npu, transposed, offset):
    """1. Per group, the kernel reads scale and offset with x2's transpose flag; the numbers prove the layout."""
    aq = _antiquant("group+offset" if offset else "group", 256, 256)
    w_kn = _int8()
    w = w_kn.t().contiguous() if transposed else w_kn
    x = _x()
    group = FakeGroup()
    out = OPS[AR](x, w, group=group, transpose_weight=transposed, **aq)
    call = ValidatedCall.validate(AR, x, w, group=group, transpose_weight=transposed, **aq)
    deq = dequantize(w, call.antiquant, transpose_weight=transposed)
    torch.testing.assert_close(out, _expected(AR, x, deq.t() if transposed else deq, None, group))
    (_, bound), = fake_npu.calls
    for name in ("antiquant_scale", "antiquant_offset") if offset else ("antiquant_scale",):
        passed = bound[name]
        assert torch.equal(passed, aq[name]) and passed.shape == (4, 256)
        assert passed.stride() == ((1, 4) if transposed else (256, 1))


TP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


@pytest.mark.parametrize("tp", TP_SIZES)
@pytest.mark.parametrize("soc", [A2_SOC, A3_SOC], ids=FAMILY.get)
@pytest.mark.parametrize("op", [RS, AG, AG2])
def test_gather_scatter_tp_sizes_are_the_documented_ones(on_soc, op, soc, tp):
    """2. Reduce-scatter / all-gather: 2, 4, 8 on A2, up to 32 on A3; any other TP is refused, never sent."""
    fake = on_soc(soc)
    x, w, _ = _operands(m=64 * 3, n=64)
    taken = {A2_SOC: {2, 4, 8}, A3_SOC: {2, 4, 8, 16, 32}}[soc]
    if tp not in taken:
        with pytest.raises(CoCBackendUnavailable, match=rf"TP size in \[.*\] on {FAMILY[soc]} "
                                                         rf"\(CANN aclnn\w+\), got tp={tp}"):
            ATB[op](x, w, group=FakeGroup(size=tp))
        assert fake.calls == []
    else:
        ATB[op](x, w, group=FakeGroup(size=tp))
        assert len(fake.calls) == 1


@pytest.mark.parametrize("tp", TP_SIZES)
def test_all_reduce_tp_sizes_are_the_documented_ones(fake_npu, tp):
    """2. Matmul + all-reduce on Atlas A2: 1, 2, 4 or 8."""
    x, w, _ = _operands(n=64)
    if tp in (1, 2, 4, 8):
        ATB[AR](x, w, group=FakeGroup(size=tp))
        assert len(fake_npu.calls) == 1
    else:
        with pytest.raises(CoCBackendUnavailable, match=rf"TP size in \[1, 2, 4, 8\] on Atlas A2 "
                                                         rf"\(CANN aclnnMatmulAllReduce\), got tp={tp}"):
            ATB[AR](x, w, group=FakeGroup(size=tp))
        assert fake_npu.calls == []


@pytest.mark.parametrize("soc", [A3_SOC, 104, 202], ids=["Atlas A3", "Ascend910B", "Ascend310P3"])
@pytest.mark.parametrize("w8a16", [False, True], ids=["plain", "w8A16"])
def test_all_reduce_is_documented_for_atlas_a2_only(on_soc, soc, w8a16):
    """3. Matmul + all-reduce, plain or w8A16, is refused on any SoC but Atlas A2, naming the SoC."""
    fake = on_soc(soc)
    x, w, _ = _operands(n=64)
    aq = {"antiquant_scale": torch.ones(1, dtype=F16)} if w8a16 else {}
    w = _int8(256, 64) if w8a16 else w
    with pytest.raises(CoCBackendUnavailable, match=rf"documented for Atlas A2 only \(CANN aclnnMatmulAllReduce\); "
                                                     rf"this NPU is .*SoC {soc}"):
        ATB[AR](x, w, group=FakeGroup(size=2), **aq)
    assert fake.calls == []
    if soc != A3_SOC:
        with pytest.raises(CoCBackendUnavailable, match="documented for Atlas A2 and Atlas A3 only"):
            ATB[RS](*_operands()[:2], group=FakeGroup(size=2))


@pytest.mark.parametrize("soc", [A2_SOC, A3_SOC], ids=FAMILY.get)
def test_one_communication_domain_on_atlas_a2(on_soc, soc):
    """4. On A2 every MC2 op of a process uses the first one's communicator; another is refused (A3: no rule)."""
    fake = on_soc(soc)
    x, w, _ = _operands()
    tp, other = FakeGroup(size=2, name="tp"), FakeGroup(size=2, name="other")
    ATB[RS](x, w, group=tp)
    ATB[AG](x, w, group=tp)
    if soc == A3_SOC:
        ATB[AG](x, w, group=other)
        assert len(fake.calls) == 3
        return
    with pytest.raises(CoCBackendUnavailable, match=r"on Atlas A2 every MC2 op of a process must use one "
                                                     r"communication domain \(CANN aclnnAllGatherMatmul\)"):
        ATB[AG](x, w, group=other)
    assert len(fake.calls) == 2


def test_the_one_domain_rule_holds_for_live_groups_only(on_soc, monkeypatch):
    """4. A2's one communication domain is about live communicators: once the first MC2 group is destroyed (torch
    may keep the object), a new group's MC2 call runs; while both live, the second is refused, ``auto`` falling
    back for it."""
    from torch.distributed.distributed_c10d import _world

    fake = on_soc(A2_SOC)
    ran = []
    monkeypatch.setattr(portable, "run", lambda call: ran.append(call.op) or "portable")
    x, w, _ = _operands()
    first, second, third = (FakeGroup(size=2, name=name) for name in ("first", "second", "third"))
    for group in (first, second, third):
        monkeypatch.setitem(_world.pg_map, group, ("hccl", None))  # created by init_process_group / new_group
    ATB[RS](x, w, group=first)
    with pytest.raises(CoCBackendUnavailable, match="another live group"):
        ATB[RS](x, w, group=second)
    assert AUTO[RS](x, w, group=second) == "portable"
    first.destroy()  # the object lives on, its communicator does not
    ATB[RS](x, w, group=second)
    assert AUTO[AG](x, w, group=second) is not None and ran == [RS]
    with pytest.raises(CoCBackendUnavailable, match="another live group"):
        ATB[AG](x, w, group=third)
    assert [call[0] for call in fake.calls] == ["npu_mm_reduce_scatter_base"] * 2 + ["npu_all_gather_base_mm"]


def test_a_group_built_outside_torchs_registry_holds_the_domain_while_it_lives(on_soc):
    fake = on_soc(A2_SOC)
    x, w, _ = _operands()
    first = FakeGroup(size=2, name="first")
    ATB[RS](x, w, group=first)
    with pytest.raises(CoCBackendUnavailable, match="another live group"):
        ATB[RS](x, w, group=FakeGroup(size=2, name="second"))
    del first  # its communicator dies with it
    gc.collect()
    ATB[RS](x, w, group=FakeGroup(size=2, name="third"))
    assert len(fake.calls) == 2


#: Calls the portable backend runs but MC2 does not take, on an Atlas A2 host.
NOT_FOR_MC2 = {
    "float32": (AR, {"dtype": torch.float32}, {}, 4, "x must be float16 or bfloat16"),
    "k below the range": (RS, {"k": 128}, {}, 4, "256 <= k < 65535"),
    "TP 3": (AG, {}, {}, 3, "TP size in [2, 4, 8]"),
    "deterministic without deterministic algorithms": (AR, {}, {"deterministic": True}, 4, "use_deterministic"),
}


@pytest.mark.skipif(torch.are_deterministic_algorithms_enabled(), reason="already deterministic")
@pytest.mark.parametrize("case", NOT_FOR_MC2)
def test_auto_falls_back_for_every_call_the_kernel_cannot_take(fake_npu, monkeypatch, caplog, case):
    """5. ``auto`` on an NPU host: MC2 where it takes the call, else portable, and the log says why."""
    op, shape, flags, tp, reason = NOT_FOR_MC2[case]
    ran = []
    monkeypatch.setattr(portable, "run", lambda call: ran.append(call) or "portable")
    x, w, _ = _operands(m=12, **shape)
    with caplog.at_level(logging.INFO, logger="coc_impl.fused"):
        assert AUTO[op](x, w, group=FakeGroup(size=tp), **flags) == "portable"
    assert len(ran) == 1 and fake_npu.calls == []
    assert reason in caplog.text and "portable backend" in caplog.text
    # The very same kind of call within the limits goes to MC2.
    AUTO[AR](*_operands()[:2], group=FakeGroup(size=4))
    assert len(ran) == 1 and len(fake_npu.calls) == 1


def test_auto_falls_back_for_another_domain_and_soc(on_soc, monkeypatch):
    """5. The SoC and the one-domain rule are limits like any other for ``auto``."""
    ran = []
    monkeypatch.setattr(portable, "run", lambda call: ran.append(call.op) or "portable")
    x, w, _ = _operands()
    on_soc(A3_SOC)
    assert AUTO[AR](x, w, group=FakeGroup(size=2)) == "portable"
    fake = on_soc(A2_SOC)
    tp = FakeGroup(size=2, name="tp")
    AUTO[AR](x, w, group=tp)
    assert AUTO[AR](x, w, group=FakeGroup(size=2, name="other")) == "portable"
    assert ran == [AR, AR] and len(fake.calls) == 1


def test_early_release_without_antiquant_arguments(on_soc, monkeypatch):
    """6. The probe reads the registered schema: no antiquant arguments, no w8A16; plain calls still run."""
    monkeypatch.setattr(portable, "run", lambda call: "portable")
    fake = on_soc(A2_SOC, stand_in.EARLY_OPS)
    assert npu_runtime.is_available()
    x, w, _ = _operands()
    OPS[AR](x, w, group=FakeGroup())
    with pytest.raises(CoCBackendUnavailable, match=r"npu_mm_all_reduce_base takes no antiquant_scale \(its "
                                                     r"registered schema\), which w8A16 per-channel needs"):
        ATB[AR](x, _int8(), group=FakeGroup(), antiquant_scale=torch.ones(256, dtype=F16))
    assert len(fake.calls) == 1
    assert AUTO[AR](x, _int8(), group=FakeGroup(), antiquant_scale=torch.ones(256, dtype=F16)) == "portable"


def test_calls_go_through_torch_ops_not_the_onnx_wrappers(fake_npu):
    """7. ``import torch_npu.onnx`` replaces ``torch_npu.<kernel>`` with positional wrappers; torch.ops stays."""
    wrapped = []

    def onnx_wrapper(x1, x2, hcom, reduce_op, bias, antiquant_scale, antiquant_offset, x3, dequant_scale,
                     pertoken_scale, comm_quant_scale_1, comm_quant_scale_2, antiquant_group_size, comm_turn):
        wrapped.append(hcom)
        raise AssertionError("the onnx wrapper was called")

    for kernel in npu_runtime.MC2_OPS:
        setattr(fake_npu, kernel, onnx_wrapper)
    x, w, bias = _operands()
    group = FakeGroup()
    torch.testing.assert_close(OPS[AR](x, w, bias, group=group), _expected(AR, x, w, bias, group))
    OPS[RS](x, w, group=group)
    OPS[AG2](x, w, group=group)
    assert wrapped == [] and len(fake_npu.calls) == 3


def test_determinism_docstring_says_why_not_mc2():
    """8. CANN documents HCCL_DETERMINISTIC for MatmulAllReduce; the docstring says why MC2 still is not used."""
    doc = " ".join(ascend.__doc__.split())
    assert "HCCL_DETERMINISTIC" in doc and "for MatmulAllReduce" in doc
    assert "not for the MC2 kernels" not in doc
    assert "no MC2 switch yields that order" in doc


# --------------------------------------------------------------------------- deterministic routing


@pytest.mark.skipif(torch.are_deterministic_algorithms_enabled(), reason="already deterministic")
@pytest.mark.parametrize("name", [AR, RS])
def test_deterministic_needs_deterministic_algorithms(fake_npu, name):
    x, w, _ = _operands()
    with pytest.raises(CoCBackendUnavailable, match="use_deterministic_algorithms"):
        OPS[name](x, w, group=FakeGroup(), deterministic=True)
    assert fake_npu.calls == []


def test_deterministic_runs_the_rank_ordered_pipeline_not_mc2(fake_npu, monkeypatch):
    """MC2 cannot promise the reference order; the portable pipeline implements it."""
    delegated = []
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    monkeypatch.setattr(portable, "run", lambda call: delegated.append(call) or call.op)
    group = FakeGroup(size=3)  # no MC2 limit applies: TP 3 is fine here
    x, w, bias = _operands(m=9, transposed=True)
    scale = torch.rand(256).to(F16)
    w8 = _int8()
    ar = ValidatedCall.validate(AR, x, w8, bias, group=group, deterministic=True, antiquant_scale=scale)
    rs = ValidatedCall.validate(RS, x, w, bias, group=group, transpose_weight=True, deterministic=True)
    assert ascend.run(ar) == AR
    assert ascend.run(rs) == RS
    # The very call, as validated: int8 weight and antiquant untouched, flags and group as given.
    assert len(delegated) == 2 and delegated[0] is ar and delegated[1] is rs
    assert ar.x is x and ar.w is w8 and ar.bias is bias and ar.group is group and not ar.transpose_weight
    assert ar.antiquant.scale is scale and ar.antiquant.offset is None and ar.antiquant.group_size == 0
    assert rs.w is w and rs.transpose_weight and rs.antiquant is None and rs.blocks is None
    assert fake_npu.calls == []


# --------------------------------------------------------------------------- on NPUs (HCCL ranks)


@requires_npu
@pytest.mark.parametrize("kernel", npu_runtime.MC2_OPS)
def test_installed_schemas_have_not_drifted(kernel):
    """The installed torch_npu registers exactly the signature the contract stores."""
    stored = torch._C.parse_schema(f"npu::{stand_in.SCHEMAS[kernel]}")
    source = stand_in.CONTRACT["source"]
    assert str(npu_runtime.registered_schema(kernel)) == str(stored), f"installed torch_npu differs from {source}"


DEV_M, DEV_K, DEV_N, DEV_G = 64, 256, 128, 64


def _device_inputs(world: int):
    gen = torch.Generator().manual_seed(7)
    x_full = torch.randn(DEV_M, DEV_K * world, generator=gen).to(F16)  # row-parallel, split along k
    w_full = torch.randn(DEV_K * world, DEV_N, generator=gen).to(F16)
    x_rows = torch.randn(DEV_M * world, DEV_K, generator=gen).to(F16)  # all-gather, split along m
    w_col = torch.randn(DEV_K, DEV_N, generator=gen).to(F16)
    w_q = torch.randint(-128, 128, (DEV_K * world, DEV_N), generator=gen, dtype=torch.int8)
    scale = (torch.rand(DEV_N, generator=gen) * 0.01 + 0.001).to(F16)
    offset = torch.randn(DEV_N, generator=gen).to(F16)
    g_scale = (torch.rand(DEV_K * world // DEV_G, DEV_N, generator=gen) * 0.01 + 0.001).to(F16)
    g_offset = torch.randn(DEV_K * world // DEV_G, DEV_N, generator=gen).to(F16)
    bias = torch.randn(DEV_N, generator=gen).to(F16)
    return x_full, w_full, x_rows, w_col, w_q, scale, offset, g_scale, g_offset, bias


def _device_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    device = npu_runtime.bind_device(rank)
    dist.init_process_group(**npu_runtime.init_process_group_kwargs(), init_method=f"file://{init_file}",
                            rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    try:
        g = dist.group.WORLD
        x_full, w_full, x_rows, w_col, w_q, scale, offset, g_scale, g_offset, bias = (
            t.to(device) for t in _device_inputs(world))
        cols = slice(rank * DEV_K, (rank + 1) * DEV_K)
        groups = slice(rank * DEV_K // DEV_G, (rank + 1) * DEV_K // DEV_G)
        x, w, wq = x_full[:, cols].contiguous(), w_full[cols].contiguous(), w_q[cols].contiguous()
        gs, go = g_scale[groups].contiguous(), g_offset[groups].contiguous()
        xr = x_rows[rank * DEV_M:(rank + 1) * DEV_M]
        ar, rs = ATB[AR], ATB[RS]
        out, refused = {}, {}

        def attempt(key, op, fn):
            try:
                out[key] = fn()
            except CoCBackendUnavailable as exc:
                refused[key] = (op, str(exc))

        attempt("ar", AR, lambda: ar(x, w, bias, group=g))
        attempt("ar_t", AR, lambda: ar(x, w.t().contiguous(), bias, group=g, transpose_weight=True))
        attempt("w8a16", AR, lambda: ar(x, wq, bias, group=g, antiquant_scale=scale, antiquant_offset=offset))
        attempt("w8a16_group", AR, lambda: ar(x, wq, bias, group=g, antiquant_scale=gs, antiquant_offset=go,
                                              antiquant_group_size=DEV_G))
        attempt("w8a16_group_t", AR, lambda: ar(x, wq.t().contiguous(), bias, group=g, transpose_weight=True,
                                                antiquant_scale=gs, antiquant_offset=go, antiquant_group_size=DEV_G))
        attempt("rs", RS, lambda: rs(x, w, bias, group=g))
        attempt("ag", AG, lambda: ATB[AG](xr, w_col, bias, group=g))
        attempt("ag_v2", AG2, lambda: ATB[AG2](xr, w_col, bias, group=g))
        out["ar_det"] = [ar(x, w, bias, group=g, deterministic=True) for _ in range(2)]
        out["rs_det"] = [rs(x, w, bias, group=g, deterministic=True) for _ in range(2)]
        out["auto_ar"] = AUTO[AR](x, w, bias, group=g)
        out["auto_rs"] = AUTO[RS](x, w, bias, group=g)
        out["auto_ag"] = AUTO[AG](xr, w_col, bias, group=g)
        out["auto_f32"] = AUTO[AR](x.float(), w.float(), bias.float(), group=g).half()
        torch.save({"out": _to_cpu(out), "refused": refused}, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {key: _to_cpu(value) for key, value in obj.items()}
    return type(obj)(_to_cpu(value) for value in obj)


def _assert_close(actual: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> None:
    """Within a few roundings of the fp64 serial result: ``eps * (sqrt(K) |A||B| + |y|)``."""
    a64, b64 = a.double(), b.double()
    want = a64 @ b64 + bias.double()
    eps = torch.finfo(actual.dtype).eps
    bound = 4 * eps * (math.sqrt(a.shape[1]) * (a64.abs() @ b64.abs()) + want.abs() + bias.double().abs())
    err = (actual.double() - want).abs()
    assert bool((err <= bound).all()), f"max error {err.max():.3g} exceeds bound at {(err - bound).argmax()}"


def _npu_worlds() -> list[int]:
    """Every TP size some MC2 kernel takes on this SoC, up to the visible NPUs."""
    if not npu_runtime.is_available():
        return []
    family = npu_runtime.soc_family(int(npu_runtime.load().npu.get_soc_version()))
    devices = npu_runtime.load().npu.device_count()
    sizes = set().union(*(limits.tp.get(family, ()) for limits in mc2_limits.LIMITS.values()))
    return sorted(tp for tp in sizes if tp <= devices)


@requires_npu
@pytest.mark.parametrize("world", _npu_worlds() or [0])
def test_fused_ops_on_npus_match_the_serial_product(tmp_path, world):
    """Every TP size the kernels take here: MC2 numbers (per-group and transposed w8A16 too), refusals, auto."""
    if not world:
        pytest.skip("no TP size the MC2 kernels take fits the visible NPUs")
    mp.spawn(_device_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    x_full, w_full, x_rows, w_col, w_q, scale, offset, g_scale, g_offset, bias = _device_inputs(world)
    w_deq = (w_q.double() + offset.double()) * scale.double()
    w_deq_g = (w_q.double() + g_offset.double().repeat_interleave(DEV_G, 0)) * g_scale.double().repeat_interleave(
        DEV_G, 0)
    family = npu_runtime.soc_family(int(npu_runtime.load().npu.get_soc_version()))
    for rank in range(world):
        saved = torch.load(tmp_path / f"{rank}.pt")
        out, refused = saved["out"], saved["refused"]
        for key, (op, message) in refused.items():  # refused exactly where the documentation says
            assert world not in mc2_limits.LIMITS[op].tp.get(family, ()), (key, message)
        rows = slice(rank * DEV_M // world, (rank + 1) * DEV_M // world)
        expected = {"ar": (x_full, w_full), "ar_t": (x_full, w_full), "w8a16": (x_full, w_deq),
                    "w8a16_group": (x_full, w_deq_g), "w8a16_group_t": (x_full, w_deq_g),
                    "auto_ar": (x_full, w_full), "auto_f32": (x_full, w_full),
                    "rs": (x_full[rows], w_full), "auto_rs": (x_full[rows], w_full),
                    "ag": (x_rows, w_col), "auto_ag": (x_rows, w_col)}
        for key, (a, b) in expected.items():
            if key in out:
                _assert_close(out[key], a, b, bias)
        if "ag_v2" in out:
            _assert_close(out["ag_v2"][0], x_rows, w_col, bias)
            assert torch.equal(out["ag_v2"][1], x_rows)
        for result in out["ar_det"]:
            _assert_close(result, x_full, w_full, bias)
        for result in out["rs_det"]:
            _assert_close(result, x_full[rows], w_full, bias)
        assert torch.equal(out["ar_det"][0], out["ar_det"][1])
        assert torch.equal(out["rs_det"][0], out["rs_det"][1])
