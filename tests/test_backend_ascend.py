"""Ascend backend: honest unavailability, host-side validation, the MC2 binding
and the deterministic routing (through a recording stand-in for torch_npu), and
device numerics over HCCL ranks (skipped without NPUs).

The backend takes a call validated by :meth:`coc_impl.ValidatedCall.validate`;
the generic argument errors are checked here through the front door with
``backend="atb"``, which must refuse them before the backend is reached."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import math
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import coc_impl.backends as backends
from coc_impl import fused
from coc_impl.backends import ascend, portable
from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable, CoCShapeError
from coc_impl.validated_call import ValidatedCall

requires_npu = pytest.mark.skipif(not ascend.is_available(), reason=str(ascend.unavailable_reason()))
without_npu = pytest.mark.skipif(ascend.is_available(), reason="an NPU is usable here")

F16, BF16 = torch.float16, torch.bfloat16


# --------------------------------------------------------------------------- stand-ins


class FakeGroup(dist.ProcessGroup):
    """An HCCL process group as the backend sees it: rank, size, communicator names."""

    def __init__(self, rank: int = 0, size: int = 4):
        super().__init__(rank, size)
        self.backend_devices: list = []

    def _get_backend(self, device):
        self.backend_devices.append(device)
        return types.SimpleNamespace(get_hccl_comm_name=lambda global_rank: f"hcom-{global_rank}")


class FakeTorchNpu(types.ModuleType):
    """torch_npu with ``devices`` visible NPUs and recording MC2 kernels.

    The kernels answer with ones of the documented output shape, so a test can
    tell exactly what the backend added to the kernel's result.
    """

    def __init__(self, devices: int = 8):
        super().__init__("torch_npu")
        self.calls: list[tuple[str, tuple, dict]] = []
        self.devices_set: list[int] = []
        self.npu = types.SimpleNamespace(
            is_available=lambda: devices > 0,
            device_count=lambda: devices,
            set_device=self.devices_set.append,
        )

    def npu_mm_all_reduce_base(self, x1, x2, hcom, **kwargs):
        self.calls.append(("npu_mm_all_reduce_base", (x1, x2, hcom), kwargs))
        return torch.ones(x1.shape[0], x2.shape[1], dtype=x1.dtype)

    def npu_mm_reduce_scatter_base(self, x1, x2, hcom, world_size, **kwargs):
        self.calls.append(("npu_mm_reduce_scatter_base", (x1, x2, hcom, world_size), kwargs))
        return torch.ones(x1.shape[0] // world_size, x2.shape[1], dtype=x1.dtype)

    def npu_all_gather_base_mm(self, x1, x2, hcom, world_size, **kwargs):
        self.calls.append(("npu_all_gather_base_mm", (x1, x2, hcom, world_size), kwargs))
        gathered = x1.repeat(world_size, 1) if kwargs["gather_output"] else x1.new_empty(0)
        return torch.ones(x1.shape[0] * world_size, x2.shape[1], dtype=x1.dtype), gathered


@pytest.fixture
def fake_npu(monkeypatch):
    """Install :class:`FakeTorchNpu` as torch_npu; the probe cache is reset around it."""
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(ascend, "_npu_device", lambda index=None: ("npu", index))
    monkeypatch.setattr(dist, "get_global_rank", lambda group, rank: 8 + rank)
    ascend._probe.cache_clear()
    yield fake
    ascend._probe.cache_clear()


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


# --------------------------------------------------------------------------- CPU honesty


def test_import_does_not_import_torch_npu(monkeypatch):
    """Importing the module must not even try to import torch_npu."""
    attempts: list[str] = []

    class Recorder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "torch_npu":
                attempts.append(name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Recorder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.delitem(sys.modules, "coc_impl.backends.ascend")
    try:
        importlib.import_module("coc_impl.backends.ascend")
    finally:
        backends.ascend = ascend  # keep the package attribute on the module under test
    assert attempts == []
    assert "torch_npu" not in sys.modules


@without_npu
def test_unavailable_with_an_honest_reason():
    assert ascend.is_available() is False
    reason = ascend.unavailable_reason()
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
    assert ascend.unavailable_reason() in str(info.value)


@without_npu
def test_rank_set_up_needs_the_runtime():
    with pytest.raises(CoCBackendUnavailable):
        ascend.init_process_group_kwargs()
    with pytest.raises(CoCBackendUnavailable):
        ascend.bind_device(0)


def test_visible_devices_env():
    assert ascend.visible_devices_env([2, 3]) == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    assert ascend.visible_devices_env(range(1)) == {"ASCEND_RT_VISIBLE_DEVICES": "0"}
    for bad in ([], [1, 1], [-1], [True], ["2"]):
        with pytest.raises(CoCArgumentError):
            ascend.visible_devices_env(bad)


# --------------------------------------------------------------------------- validation on CPU


def _int8(k=256, n=256):
    return torch.randint(-128, 128, (k, n), dtype=torch.int8)


def _x(m=8, k=256, dtype=F16):
    return torch.randn(m, k).to(dtype)


G = FakeGroup()
AR = ATB["matmul_all_reduce"]


def _aq(scale_shape, group_size=0, offset_shape=None, dtype=F16):
    """matmul_all_reduce of an int8 [256, 256] weight with these antiquant arguments."""
    offset = None if offset_shape is None else torch.ones(offset_shape, dtype=F16)
    return lambda: AR(_x(), _int8(), group=G, antiquant_scale=torch.ones(scale_shape, dtype=dtype),
                      antiquant_offset=offset, antiquant_group_size=group_size)


#: Refused by the front door's single validation, whatever the backend.
INVALID = {
    "x 3-D": (lambda: AR(_x().view(2, 4, 256), _x(256, 256), group=G), "x must be 2-D"),
    "int8 w, float32 x": (lambda: AR(_x(dtype=torch.float32), _int8(), group=G,
                                     antiquant_scale=torch.ones(1)), "w8A16"),
    "w dtype": (lambda: AR(_x(), _x(256, 256, BF16), group=G), "must match"),
    "k mismatch": (lambda: AR(_x(), _x(128, 256), group=G), "w's k=128"),
    "k mismatch transposed": (lambda: AR(_x(), _x(256, 128), group=G, transpose_weight=True),
                              r"\[n, k\].*w's k=128"),
    "transpose flag": (lambda: AR(_x(), _x(256, 256), group=G, transpose_weight=1), "must be True or False"),
    "empty": (lambda: AR(_x(0), _x(256, 256), group=G), "empty"),
    "bias shape": (lambda: AR(_x(), _x(256, 128), torch.zeros(1, 128, dtype=F16), group=G),
                   r"bias must have shape \[n=128\]"),
    "bias dtype": (lambda: AR(_x(), _x(256, 128), torch.zeros(128), group=G), "bias has dtype"),
    "int8 without scale": (lambda: AR(_x(), _int8(), group=G), "antiquant_scale is missing"),
    "scale without int8": (lambda: AR(_x(), _x(256, 256), group=G,
                                      antiquant_scale=torch.ones(1, dtype=F16)), "w8A16 needs an int8 w"),
    "group size not /32": (_aq((6, 256), 48), "multiple of 32"),
    "group size >= k": (_aq((1, 256), 256), "antiquant_group_size < k=256"),
    "per-group shape": (_aq((4, 256), 32), r"\[ceil\(k/g\), n\] = \[8, 256\]"),
    "per-channel shape": (_aq((255,)), "per-channel"),
    "offset shape": (_aq((256,), offset_shape=(1,)), "antiquant_offset has shape"),
    "scale dtype": (_aq((256,), dtype=BF16), "antiquant_scale has dtype"),
    "int8 reduce-scatter": (lambda: ATB["matmul_reduce_scatter"](_x(), _int8(), group=G),
                            "matmul_all_reduce only"),
    "int8 all-gather": (lambda: ATB["all_gather_matmul"](_x(), _int8(), group=G), "matmul_all_reduce only"),
    "no group": (lambda: AR(_x(), _x(256, 256), group=None), "group must be the tensor-parallel ProcessGroup"),
    "not a member": (lambda: AR(_x(), _x(256, 256), group=FakeGroup(rank=-1)), "not a member"),
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
        ATB["matmul_reduce_scatter"](x, w, group=FakeGroup(size=4))
    assert backend_spy == []


@pytest.mark.parametrize("name", OPS)
def test_mc2_activation_dtypes_are_checked_before_the_runtime(name):
    """float32 is a valid call, but not for MC2: said on the host, before torch_npu is asked for."""
    x, w, _ = _operands(dtype=torch.float32)
    with pytest.raises(CoCArgumentError, match="x must be float16 or bfloat16 on Ascend, got torch.float32"):
        OPS[name](x, w, group=G)


# --------------------------------------------------------------------------- binding (fake torch_npu)


def test_fake_runtime_is_available_and_binds(fake_npu):
    assert ascend.is_available() and ascend.unavailable_reason() is None
    assert ascend.init_process_group_kwargs() == {"backend": "hccl"}
    assert ascend.bind_device(1) == ("npu", 1)
    assert fake_npu.devices_set == [1]


def test_reasons_name_the_missing_piece(monkeypatch):
    ascend._probe.cache_clear()
    try:
        monkeypatch.setitem(sys.modules, "torch_npu", None)  # import raises ImportError
        assert ascend.unavailable_reason().startswith("torch_npu is not importable: ModuleNotFoundError")
        ascend._probe.cache_clear()
        monkeypatch.setitem(sys.modules, "torch_npu", FakeTorchNpu(devices=0))
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "5")
        assert ascend.unavailable_reason() == "no NPU device visible (ASCEND_RT_VISIBLE_DEVICES=5)"
        ascend._probe.cache_clear()
        old = types.ModuleType("torch_npu")
        old.npu = FakeTorchNpu().npu
        old.npu_mm_all_reduce_base = FakeTorchNpu().npu_mm_all_reduce_base
        monkeypatch.setitem(sys.modules, "torch_npu", old)
        reason = ascend.unavailable_reason()
        assert "npu_mm_reduce_scatter_base" in reason and "npu_all_gather_base_mm" in reason
        with pytest.raises(CoCBackendUnavailable, match="lacks the MC2 ops"):
            OPS["matmul_all_reduce"](*_operands(), group=FakeGroup())
    finally:
        ascend._probe.cache_clear()


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("transpose_weight", [False, True])
def test_weight_is_passed_as_kn_view_never_guessed(fake_npu, name, transpose_weight):
    """Square weights: only the flag can say which way round ``w`` is."""
    x, w, _ = _operands(k=256, n=256, transposed=transpose_weight)
    OPS[name](x, w, group=FakeGroup(), transpose_weight=transpose_weight)
    (_, args, _), = fake_npu.calls
    x2 = args[1]
    assert x2.data_ptr() == w.data_ptr()  # a view, never a copy
    assert torch.equal(x2, w.t() if transpose_weight else w)
    assert x2.stride() == ((1, 256) if transpose_weight else (256, 1))


def test_strided_weight_is_made_contiguous(fake_npu):
    x, _, _ = _operands()
    w = torch.randn(256, 512).to(F16)[:, ::2]  # neither ND nor a transposed ND view
    OPS["matmul_all_reduce"](x, w, group=FakeGroup())
    (_, (_, x2, _), _), = fake_npu.calls
    assert x2.is_contiguous() and torch.equal(x2, w)


@pytest.mark.parametrize("entry", [OPS, ATB], ids=["backend", "front door"])
@pytest.mark.parametrize("name", OPS)
def test_bias_is_added_once_after_the_kernel(fake_npu, name, entry):
    x, w, bias = _operands()
    result = entry[name](x, w, bias, group=FakeGroup(size=4))
    out = result[0] if isinstance(result, tuple) else result
    (_, args, kwargs), = fake_npu.calls
    assert args[0] is x and args[1] is w  # the operands as given, through the call object
    assert "bias" not in kwargs
    assert torch.equal(out, torch.ones_like(out) + bias)


def test_hcom_and_world_size_come_from_the_group(fake_npu):
    group = FakeGroup(rank=1, size=4)
    x, w, _ = _operands()
    OPS["matmul_all_reduce"](x, w, group=group)
    OPS["matmul_reduce_scatter"](x, w, group=group)
    OPS["all_gather_matmul"](x, w, group=group)
    ar, rs, ag = fake_npu.calls
    assert ar[1][2] == rs[1][2] == ag[1][2] == "hcom-9"  # global rank of group rank 1
    assert rs[1][3] == ag[1][3] == 4
    assert group.backend_devices == [("npu", None)] * 3
    assert ar[2] == {"reduce_op": "sum", "comm_turn": 0}
    assert rs[2] == {"reduce_op": "sum", "comm_turn": 0}
    assert ag[2] == {"gather_index": 0, "gather_output": False, "comm_turn": 0}


def test_all_gather_v2_returns_the_gathered_input(fake_npu):
    x, w, bias = _operands(m=8)
    out, gathered = OPS["all_gather_matmul_v2"](x, w, bias, group=FakeGroup(size=4))
    assert fake_npu.calls[0][2]["gather_output"] is True
    assert out.shape == (32, 256) and torch.equal(gathered, x.repeat(4, 1))
    assert isinstance(OPS["all_gather_matmul"](x, w, group=FakeGroup(size=4)), torch.Tensor)


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_antiquant_arguments_pass_through(fake_npu, dtype):
    x = _x(dtype=dtype)
    w = _int8()
    scale, offset = torch.rand(8, 256).to(dtype), torch.randn(8, 256).to(dtype)
    OPS["matmul_all_reduce"](x, w, group=FakeGroup(), antiquant_scale=scale, antiquant_offset=offset,
                             antiquant_group_size=32)
    per_channel = torch.rand(256).to(dtype)
    OPS["matmul_all_reduce"](x, w, group=FakeGroup(), antiquant_scale=per_channel)
    grouped, channel = (kwargs for _, _, kwargs in fake_npu.calls)
    assert grouped["antiquant_scale"] is scale and grouped["antiquant_offset"] is offset
    assert grouped["antiquant_group_size"] == 32
    assert channel["antiquant_scale"] is per_channel
    assert "antiquant_offset" not in channel and "antiquant_group_size" not in channel


@pytest.mark.parametrize("name", ["matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2"])
def test_mc2_k_range_is_reported_not_sent(fake_npu, name):
    x, w, _ = _operands(k=128)
    with pytest.raises(CoCBackendUnavailable, match="256 <= k < 65535, got k=128"):
        OPS[name](x, w, group=FakeGroup())
    assert fake_npu.calls == []


@pytest.mark.skipif(torch.are_deterministic_algorithms_enabled(), reason="already deterministic")
@pytest.mark.parametrize("name", ["matmul_all_reduce", "matmul_reduce_scatter"])
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
    group = FakeGroup()
    x, w, bias = _operands(transposed=True)
    scale = torch.rand(256).to(F16)
    w8 = _int8()
    ar = ValidatedCall.validate("matmul_all_reduce", x, w8, bias, group=group, deterministic=True,
                               antiquant_scale=scale)
    rs = ValidatedCall.validate("matmul_reduce_scatter", x, w, bias, group=group, transpose_weight=True,
                               deterministic=True)
    assert ascend.run(ar) == "matmul_all_reduce"
    assert ascend.run(rs) == "matmul_reduce_scatter"
    # The very call, as validated: int8 weight and antiquant untouched, flags and group as given.
    assert len(delegated) == 2 and delegated[0] is ar and delegated[1] is rs
    assert ar.x is x and ar.w is w8 and ar.bias is bias and ar.group is group and not ar.transpose_weight
    assert ar.antiquant.scale is scale and ar.antiquant.offset is None and ar.antiquant.group_size == 0
    assert rs.w is w and rs.transpose_weight and rs.antiquant is None and rs.blocks is None
    assert fake_npu.calls == []


# --------------------------------------------------------------------------- on NPUs (HCCL ranks)

DEV_M, DEV_K, DEV_N = 64, 256, 128


def _device_inputs(world: int):
    gen = torch.Generator().manual_seed(7)
    x_full = torch.randn(DEV_M, DEV_K * world, generator=gen).to(F16)  # row-parallel, split along k
    w_full = torch.randn(DEV_K * world, DEV_N, generator=gen).to(F16)
    x_rows = torch.randn(DEV_M * world, DEV_K, generator=gen).to(F16)  # all-gather, split along m
    w_col = torch.randn(DEV_K, DEV_N, generator=gen).to(F16)
    w_q = torch.randint(-128, 128, (DEV_K * world, DEV_N), generator=gen, dtype=torch.int8)
    scale = (torch.rand(DEV_N, generator=gen) * 0.01 + 0.001).to(F16)
    offset = torch.randn(DEV_N, generator=gen).to(F16)
    bias = torch.randn(DEV_N, generator=gen).to(F16)
    return x_full, w_full, x_rows, w_col, w_q, scale, offset, bias


def _device_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    device = ascend.bind_device(rank)
    dist.init_process_group(**ascend.init_process_group_kwargs(), init_method=f"file://{init_file}",
                            rank=rank, world_size=world)
    torch.use_deterministic_algorithms(True)
    try:
        g = dist.group.WORLD
        x_full, w_full, x_rows, w_col, w_q, scale, offset, bias = (
            t.to(device) for t in _device_inputs(world))
        cols = slice(rank * DEV_K, (rank + 1) * DEV_K)
        x, w, wq = x_full[:, cols].contiguous(), w_full[cols].contiguous(), w_q[cols].contiguous()
        xr = x_rows[rank * DEV_M:(rank + 1) * DEV_M]
        ar, rs = ATB["matmul_all_reduce"], ATB["matmul_reduce_scatter"]
        out = {
            "ar": ar(x, w, bias, group=g),
            "ar_t": ar(x, w.t().contiguous(), bias, group=g, transpose_weight=True),
            "ar_det": [ar(x, w, bias, group=g, deterministic=True) for _ in range(2)],
            "rs": rs(x, w, bias, group=g),
            "rs_det": [rs(x, w, bias, group=g, deterministic=True) for _ in range(2)],
            "ag": ATB["all_gather_matmul"](xr, w_col, bias, group=g),
            "ag_v2": ATB["all_gather_matmul_v2"](xr, w_col, bias, group=g),
            "w8a16": ar(x, wq, bias, group=g, antiquant_scale=scale, antiquant_offset=offset),
        }
        torch.save(_to_cpu(out), Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {key: _to_cpu(value) for key, value in obj.items()}
    return type(obj)(_to_cpu(value) for value in obj)


def _assert_close(actual: torch.Tensor, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> None:
    """Within a few fp16 roundings of the fp64 serial result: ``eps * (sqrt(K) |A||B| + |y|)``."""
    a64, b64 = a.double(), b.double()
    want = a64 @ b64 + bias.double()
    eps = torch.finfo(actual.dtype).eps
    bound = 4 * eps * (math.sqrt(a.shape[1]) * (a64.abs() @ b64.abs()) + want.abs() + bias.double().abs())
    err = (actual.double() - want).abs()
    assert bool((err <= bound).all()), f"max error {err.max():.3g} exceeds bound at {(err - bound).argmax()}"


@requires_npu
def test_fused_ops_on_npus_match_the_serial_product(tmp_path):
    devices = ascend.load().npu.device_count()
    world = next((w for w in (8, 4, 2) if w <= devices), 0)
    if not world:
        pytest.skip(f"MC2 needs 2, 4 or 8 NPUs; {devices} visible")
    mp.spawn(_device_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    x_full, w_full, x_rows, w_col, w_q, scale, offset, bias = _device_inputs(world)
    w_deq = (w_q.double() + offset.double()) * scale.double()
    for rank in range(world):
        out = torch.load(tmp_path / f"{rank}.pt")
        rows = slice(rank * DEV_M // world, (rank + 1) * DEV_M // world)
        for name in ("ar", "ar_t", "ar_det"):
            for result in out[name] if name == "ar_det" else [out[name]]:
                _assert_close(result, x_full, w_full, bias)
        for result in [out["rs"], *out["rs_det"]]:
            _assert_close(result, x_full[rows], w_full, bias)
        _assert_close(out["ag"], x_rows, w_col, bias)
        _assert_close(out["ag_v2"][0], x_rows, w_col, bias)
        assert torch.equal(out["ag_v2"][1], x_rows)
        _assert_close(out["w8a16"], x_full, w_deq, bias)
        assert torch.equal(out["ar_det"][0], out["ar_det"][1])
        assert torch.equal(out["rs_det"][0], out["rs_det"][1])
