"""Rank-side tasks of the w8A16 checks: a dequantised ``matmul_all_reduce``, or a call made invalid on purpose."""

from __future__ import annotations

import time
from typing import Any

from conformance.cases.memory import poisoned_allocations, to_cpu, to_device
from conformance.contract.jobs import QuantRun
from conformance.contract.layouts import Split, shard
from conformance.contract.problems import quant_operands
from conformance.contract.results import OpCallResults
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.case import IMPL, REFERENCE, RankContext
from conformance.harness.observed import observed_collectives
from conformance.harness.probes import record_collectives


def quant_task(ctx: RankContext, *, run: QuantRun) -> OpCallResults:
    """w8A16 matmul_all_reduce on this rank and its live serial composition (or the refused call)."""
    import torch.distributed as dist

    from golden import serial

    ctx.budget_from(0.0)  # the floor, until the serial reference's time is known
    operands, group_size, dtype = rank_quant_operands(run, ctx.rank, ctx.world_size, ctx.device)
    x, w, scale, offset, bias = (operands[n] for n in ("x", "w", "scale", "offset", "bias"))
    kwargs: dict[str, Any] = {"antiquant_scale": scale, "antiquant_offset": offset,
                              "antiquant_group_size": group_size}
    call = OpCallResults([])
    if run.change is not None:
        x, bias, kwargs = _invalid(run.change, x, w, kwargs)
    else:
        start = time.perf_counter()
        with ctx.timer(REFERENCE):  # synchronises the device at its edges: the serial time is what ran
            ref = x @ serial.dequantize(w, scale, offset, group_size or None).to(dtype)
            dist.all_reduce(ref, group=ctx.group)
            call.serial = ref if bias is None else ref + bias
        ctx.budget_from(time.perf_counter() - start)
    with record_collectives() as log, poisoned_allocations(device=ctx.device), ctx.timer(IMPL):
        result, error = call_capturing_errors(ctx.impl.matmul_all_reduce, x, w, bias, group=ctx.group, **kwargs)
    call.timelines.append(observed_collectives(log))
    call.errors.append(error)
    call.results.append(to_cpu(result) if error is None else None)
    call.serial = to_cpu(call.serial)
    return call


def rank_quant_operands(run: QuantRun, tp_rank: int, tp: int, device: str) -> tuple[dict[str, Any], int, Any]:
    """This rank's x, w, scale, offset and bias of ``run`` on ``device`` (None where absent; drawn or loaded on
    the CPU, moved whole, then sharded), its group size (0: none) and activation dtype."""
    inputs, group_size, dtype = quant_inputs(run)
    inputs = to_device(inputs, device)
    x = shard(inputs["x"], Split.LAST, tp_rank, tp)
    w = shard(inputs["w"], Split.SEQ, tp_rank, tp)
    scale, offset = inputs["scale"], inputs.get("offset")
    if group_size:  # group rows follow their k rows (k/tp is a multiple of g)
        scale = shard(scale, Split.SEQ, tp_rank, tp)
        offset = None if offset is None else shard(offset, Split.SEQ, tp_rank, tp)
    return {"x": x, "w": w, "scale": scale, "offset": offset, "bias": inputs.get("bias")}, group_size, dtype


def quant_inputs(run: QuantRun) -> tuple[dict[str, Any], int, Any]:
    """The global inputs of ``run`` (present ones only), its group size (0: none) and activation dtype."""
    import torch

    if run.seeded is not None:
        group_size = run.seeded.group_size if run.seeded.granularity == "per_group" else 0
        return quant_operands(run.seeded), group_size, getattr(torch, run.seeded.dtype)
    import golden

    assert run.case_id is not None
    g = golden.load(run.case_id)
    return {name: g.tensor(name) for name in g.inputs}, g.params["group_size"] or 0, g.dtype


#: Invalid w8A16 arguments, each refused with a message naming what is wrong.
BAD_QUANT = ("scale-shape", "offset-shape", "offset-without-scale", "group-not-multiple-of-32",
             "group-rows-wrong", "group-not-below-k", "float32-activations", "int8-without-scale")


def _invalid(change: str, x: Any, w: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    import torch

    k_local, n = w.shape

    def ones(*shape: int, dtype: Any = x.dtype) -> Any:
        return torch.ones(*shape, dtype=dtype, device=x.device)

    kwargs = {"antiquant_scale": ones(n), "antiquant_offset": None, "antiquant_group_size": 0}
    if change == "scale-shape":
        kwargs["antiquant_scale"] = ones(n + 1)
    elif change == "offset-shape":
        kwargs["antiquant_offset"] = ones(2, n)
    elif change == "offset-without-scale":
        kwargs.update(antiquant_scale=None, antiquant_offset=ones(n))
    elif change == "group-not-multiple-of-32":
        kwargs.update(antiquant_group_size=48, antiquant_scale=ones(-(-k_local // 48), n))
    elif change == "group-rows-wrong":
        kwargs.update(antiquant_group_size=32, antiquant_scale=ones(k_local // 32 + 1, n))
    elif change == "group-not-below-k":
        kwargs.update(antiquant_group_size=k_local, antiquant_scale=ones(1, n))
    elif change == "float32-activations":
        x = x.float()
        kwargs["antiquant_scale"] = ones(n, dtype=torch.float32)
    elif change == "int8-without-scale":
        kwargs["antiquant_scale"] = None
    else:
        raise ValueError(change)
    return x, None, kwargs
