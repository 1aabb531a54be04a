"""torch_npu's MC2 kernels on the emulated node: the contract's schemas, each kernel's documented formula,
x2's layout and the w8A16 scales as the kernel reads them, the CANN pages' refusals, the call counts."""

from __future__ import annotations

import torch

from npu_sim import contract
from npu_sim.testing import in_npu_process, run_ranks

AR, RS, AG = "npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base", "npu_all_gather_base_mm"


def _registered():
    import torch
    import torch_npu

    return {kernel: (str(getattr(torch.ops.npu, kernel).default._schema),
                     getattr(torch_npu, kernel) is getattr(torch.ops.npu, kernel), torch_npu.__version__)
            for kernel in contract.SCHEMAS}


def test_the_kernels_have_the_contracts_schemas_byte_for_byte():
    registered = in_npu_process(_registered)
    assert set(registered) == {AR, RS, AG}
    for kernel, line in contract.SCHEMAS.items():
        schema, exported, version = registered[kernel]
        assert schema == str(torch._C.parse_schema(f"npu::{line}")), kernel
        assert exported and version == "2.13.0+npusim"


# --------------------------------------------------------------------------- formulas


def _hcom(group=None):
    import torch
    import torch.distributed as dist

    group = group or dist.group.WORLD
    return group._get_backend(torch.device("npu")).get_hccl_comm_name(dist.get_rank())


def _data(*shape, seed, dtype=torch.float16):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


def _product(x, w, bias=None):
    """One rank's local product as the device computes it: the GEMM rule, bias in float32, one rounding."""
    from npu_sim import gemm

    total = gemm.accumulate(x, w)
    return (total if bias is None else total + bias.float()).to(x.dtype)


def _bits(t):
    return t.cpu().view(torch.int16).tolist()


def _formulas(rank, world):
    import torch

    hcom, npu = _hcom(), torch.ops.npu
    m, k, n = 8, 256, 128
    xs = [_data(m, k, seed=10 + r) for r in range(world)]
    ws = [_data(k, n, seed=20 + r) for r in range(world)]
    bias = _data(n, seed=30)
    products = [_product(x, w) for x, w in zip(xs, ws)]
    biased = [_product(x, w, bias) for x, w in zip(xs, ws)]
    out = {}
    out["all_reduce"] = (_bits(npu.npu_mm_all_reduce_base(xs[rank].npu(), ws[rank].npu(), hcom)),
                         _bits(products[0] + products[1]))
    out["all_reduce bias"] = (
        _bits(npu.npu_mm_all_reduce_base(xs[rank].npu(), ws[rank].npu(), hcom, bias=bias.npu())),
        _bits(biased[0] + biased[1]),  # every rank adds the bias before the reduction
        _bits(products[0] + products[1] + bias),  # what a bias added once would give
    )
    rows = slice(rank * m // world, (rank + 1) * m // world)
    out["reduce_scatter"] = (_bits(npu.npu_mm_reduce_scatter_base(xs[rank].npu(), ws[0].npu(), hcom, world)),
                             _bits((_product(xs[0], ws[0]) + _product(xs[1], ws[0]))[rows]))
    gathered_x = torch.cat(xs)
    result, gathered = npu.npu_all_gather_base_mm(xs[rank].npu(), ws[0].npu(), hcom, world)
    out["all_gather"] = (_bits(result), _bits(_product(gathered_x, ws[0])), _bits(gathered), _bits(gathered_x))
    result, nothing = npu.npu_all_gather_base_mm(xs[rank].npu(), ws[0].npu(), hcom, world, gather_output=False)
    out["all_gather no output"] = (list(nothing.shape), str(nothing.device))
    return out


def test_each_kernel_computes_its_documented_formula(tmp_path):
    for out in run_ranks(_formulas, 2, tmp_path):
        assert out["all_reduce"][0] == out["all_reduce"][1]
        got, per_rank, once = out["all_reduce bias"]
        assert got == per_rank and got != once, "the all-reduce kernel adds the bias on every rank"
        assert out["reduce_scatter"][0] == out["reduce_scatter"][1]
        result, expected, gathered, expected_gathered = out["all_gather"]
        assert result == expected and gathered == expected_gathered, "x1 gathered rank-major, then multiplied"
        assert out["all_gather no output"] == ([0], "npu:0")


def _layouts(rank, world):
    import math

    import torch

    hcom, npu = _hcom(), torch.ops.npu
    m, k, n, group = 8, 256, 256, 64
    x = _data(m, k, seed=1)
    w_nk = _data(n, k, seed=2)  # a weight stored [n, k], as Linear stores it
    facts = {
        "transposed view": _bits(npu.npu_mm_all_reduce_base(x.npu(), w_nk.npu().t(), hcom)),
        "as stored": _bits(npu.npu_mm_all_reduce_base(x.npu(), w_nk.npu(), hcom)),
        "x @ w.t()": _bits(_product(x, w_nk.t()) * world),
        "x @ w": _bits(_product(x, w_nk) * world),
    }
    try:
        npu.npu_mm_all_reduce_base(x.npu(), w_nk.npu()[:, :k][::2].t(), hcom)
        facts["strided"] = "accepted"
    except RuntimeError as error:
        facts["strided"] = str(error)
    # w8A16: int8 weight, per-channel and per-group scales (x2 transposed: the scale as [n, groups] memory).
    q_nk = torch.randint(-128, 128, (n, k), generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    channel = (torch.rand(n, generator=torch.Generator().manual_seed(4)) * 0.01).to(torch.float16)
    groups = math.ceil(k / group)
    grouped = (torch.rand(groups, n, generator=torch.Generator().manual_seed(5)) * 0.01).to(torch.float16)
    offset = torch.randn(groups, n, generator=torch.Generator().manual_seed(6)).to(torch.float16)

    def dequantised(scale, shift=None):
        weight = q_nk.t().float() + (shift.float().repeat_interleave(group, 0) if shift is not None else 0)
        scale = scale.float().repeat_interleave(group, 0) if scale.dim() == 2 else scale.float()
        return (weight * scale).to(torch.float16)

    facts["per channel"] = (
        _bits(npu.npu_mm_all_reduce_base(x.npu(), q_nk.npu().t(), hcom, antiquant_scale=channel.npu())),
        _bits(_product(x, dequantised(channel)) * world))
    in_x2_layout = grouped.t().contiguous().t()  # the transposed view of an ND [n, groups] tensor
    facts["per group"] = (
        _bits(npu.npu_mm_all_reduce_base(x.npu(), q_nk.npu().t(), hcom, antiquant_scale=in_x2_layout.npu(),
                                         antiquant_offset=offset.t().contiguous().t().npu(),
                                         antiquant_group_size=group)),
        _bits(_product(x, dequantised(grouped, offset)) * world))
    facts["per group, scale not in x2's layout"] = _bits(npu.npu_mm_all_reduce_base(
        x.npu(), q_nk.npu().t(), hcom, antiquant_scale=grouped.npu(),
        antiquant_offset=offset.t().contiguous().t().npu(), antiquant_group_size=group))
    return facts


def test_x2_and_the_w8a16_scales_are_read_in_their_layout(tmp_path):
    for facts in run_ranks(_layouts, 2, tmp_path):
        assert facts["transposed view"] == facts["x @ w.t()"], "a transposed view is read as transposed"
        assert facts["as stored"] == facts["x @ w"] != facts["x @ w.t()"], "a contiguous copy is another matrix"
        assert "x2 must be a 2-D ND tensor or the transposed view of one" in facts["strided"]
        assert facts["per channel"][0] == facts["per channel"][1]
        assert facts["per group"][0] == facts["per group"][1]
        assert facts["per group, scale not in x2's layout"] != facts["per group"][1]


# --------------------------------------------------------------------------- refusals


def _refusals(rank, world, soc):
    import torch
    import torch.distributed as dist

    import npu_sim

    npu = torch.ops.npu
    x, w = _data(8, 256, seed=1).npu(), _data(256, 128, seed=2).npu()
    first, second = dist.new_group(list(range(world))), dist.new_group(list(range(world)))
    hcom = _hcom(first)
    attempts = {
        "float32": lambda: npu.npu_mm_reduce_scatter_base(x.float(), w.float(), hcom, world),
        "k": lambda: npu.npu_all_gather_base_mm(x[:, :128].contiguous(), w[:128], hcom, world),
        "m": lambda: npu.npu_mm_reduce_scatter_base(x[:3], w, hcom, world),
        "bias rs": lambda: npu.npu_mm_reduce_scatter_base(x, w, hcom, world, bias=w[0].contiguous()),
        "bias ag": lambda: npu.npu_all_gather_base_mm(x, w, hcom, world, bias=w[0].contiguous()),
        "reduce_op": lambda: npu.npu_mm_reduce_scatter_base(x, w, hcom, world, reduce_op="max"),
        "world_size": lambda: npu.npu_all_gather_base_mm(x, w, hcom, world + 2),
        "all_reduce": lambda: npu.npu_mm_all_reduce_base(x, w, hcom),
        "first domain": lambda: npu.npu_mm_reduce_scatter_base(x, w, hcom, world),
        "second domain": lambda: npu.npu_all_gather_base_mm(x, w, _hcom(second), world),
        "quantised": lambda: npu.npu_mm_reduce_scatter_base(x, w, hcom, world, x2_scale=w[0].float()),
        "cpu": lambda: npu.npu_mm_reduce_scatter_base(x.cpu(), w.cpu(), hcom, world),
    }
    outcome = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            outcome[name] = "ran"
        except (RuntimeError, NotImplementedError) as error:
            outcome[name] = f"{type(error).__name__}: {error}"
    dist.destroy_process_group(first)
    try:
        npu.npu_all_gather_base_mm(x, w, _hcom(second), world)
        outcome["after the first is destroyed"] = "ran"
    except RuntimeError as error:
        outcome["after the first is destroyed"] = str(error)
    outcome["calls"] = npu_sim.mc2_calls()
    return outcome


def test_what_the_cann_pages_rule_out_is_refused_naming_the_page(tmp_path):
    outcome = run_ranks(_refusals, 2, tmp_path, "Ascend910B3")[0]
    rs, ag = "(CANN aclnnMatmulReduceScatter)", "(CANN aclnnAllGatherMatmul)"
    assert outcome["float32"] == f"Mc2Refused: {RS}: x1 must be float16 or bfloat16, got torch.float32 {rs}"
    assert outcome["k"] == f"Mc2Refused: {AG}: 256 <= k < 65535, got k=128 {ag}"
    assert outcome["m"] == f"Mc2Refused: {RS}: m=3 must be a multiple of world_size=2 {rs}"
    assert outcome["bias rs"].endswith(f"a bias is not supported (the page supports a null bias only) {rs}")
    assert outcome["bias ag"].endswith(f"a bias is not supported (the page supports a null bias only) {ag}")
    assert outcome["reduce_op"].endswith(f"reduce_op must be 'sum', got 'max' {rs}")
    assert outcome["world_size"].endswith(f"world_size=4 but the communication domain has 2 ranks {ag}")
    assert outcome["all_reduce"] == outcome["first domain"] == "ran"
    assert outcome["second domain"].startswith(f"Mc2Refused: {AG}: on Atlas A2 a process's MC2 operators support "
                                               "only one communication domain")
    assert outcome["second domain"].endswith(ag)
    assert outcome["quantised"].startswith("NotImplementedError: npu-sim does not model")
    assert "Could not run 'npu::npu_mm_reduce_scatter_base' with arguments from the 'CPU' backend" in outcome["cpu"]
    assert outcome["after the first is destroyed"] == "ran", "the domain goes with its communicator"
    assert outcome["calls"] == {AR: 1, RS: 1, AG: 1}, "every call that ran is counted, no refused one"


def test_atlas_a3_takes_a_second_domain(tmp_path):
    outcome = run_ranks(_refusals, 2, tmp_path, "Ascend910_9391", env={"NPU_SIM_SOC": "Ascend910_9391"})[0]
    assert outcome["first domain"] == outcome["second domain"] == "ran"
    assert outcome["all_reduce"] == (f"Mc2Refused: {AR}: documented for Atlas A2 only, not Ascend910_9391 "
                                     "(Atlas A3) (CANN aclnnMatmulAllReduce)")


def _tp_one(rank, world):
    import torch

    x, w = _data(8, 256, seed=1).npu(), _data(256, 128, seed=2).npu()
    hcom, outcome = _hcom(), {}
    for name, call in {AR: lambda: torch.ops.npu.npu_mm_all_reduce_base(x, w, hcom),
                       RS: lambda: torch.ops.npu.npu_mm_reduce_scatter_base(x, w, hcom, 1)}.items():
        try:
            call()
            outcome[name] = "ran"
        except RuntimeError as error:
            outcome[name] = str(error)
    return outcome


def test_tp_sizes_per_product_line(tmp_path):
    outcome = run_ranks(_tp_one, 1, tmp_path)[0]
    assert outcome[AR] == "ran"  # all-reduce takes TP 1 on Atlas A2
    assert outcome[RS] == f"{RS}: TP sizes [2, 4, 8] on Atlas A2, got 1 (CANN aclnnMatmulReduceScatter)"
