"""Rank-side cases for the fused-op checks (SPEC §4).

Each shards a golden op case for this rank, calls the implementation's op and,
on request, the live serial composition (matmul, then the collective, in the
same dtype) and the serial deterministic reference.  The deterministic
reference is defined here, independently of any implementation:

    P_r = x_r.float() @ w_r.float()            (the rank's fp32 partial)
    S   = (((P_0 + P_1) + P_2) + ...)          (ascending rank order, fp32)
    out = (S + bias.float()).to(dtype)         (bias once, one final cast)

with ``w_r`` the logical ``[k, n]`` weight, contiguous; for reduce-scatter
rank ``r`` keeps rows ``r*m/tp : (r+1)*m/tp`` of ``out``.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from conformance.case import CaseContext
from conformance.layouts import Split, shard

#: How each op's operands are split over the TP ranks (global X [m, k], W [k, n]).
OPERAND_SPLITS = {
    "matmul_all_reduce": {"x": Split.LAST, "w": Split.SEQ, "y": Split.FULL},
    "matmul_reduce_scatter": {"x": Split.LAST, "w": Split.SEQ, "y": Split.SEQ},
    "all_gather_matmul": {"x": Split.SEQ, "w": Split.FULL, "y": Split.FULL},
    "all_gather_matmul_v2": {"x": Split.SEQ, "w": Split.FULL, "y": Split.FULL},
}


def accepts(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes keyword ``name`` (or any keyword)."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def operands(g: Any, op: str, rank: int, tp: int, *, transpose_weight: bool = False) -> dict[str, Any]:
    """This rank's x, w (stored ``[n, k]`` when ``transpose_weight``) and bias."""
    splits = OPERAND_SPLITS[op]
    x = shard(g.tensor("x"), splits["x"], rank, tp)
    w = shard(g.tensor("w"), splits["w"], rank, tp)
    if transpose_weight:
        w = w.T.contiguous()
    bias = g.tensor("bias") if "bias" in g.inputs else None
    return {"x": x, "w": w, "bias": bias}


@contextmanager
def random_delays(seed: int, max_s: float = 0.004) -> Iterator[None]:
    """Sleep a random time before every torch.distributed collective of this rank.

    Ranks then arrive at each collective in a different order every run, which
    is what a reduction "in arrival order" would expose.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    rng = random.Random(seed)
    names = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
             "reduce_scatter", "all_to_all_single", "broadcast")
    saved = {name: getattr(c10d, name) for name in names if hasattr(c10d, name)}
    saved_dist = {name: getattr(dist, name) for name in saved}

    def delayed(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            time.sleep(rng.random() * max_s)
            return original(*args, **kwargs)

        return call

    try:
        for name, original in saved.items():
            setattr(c10d, name, delayed(original))
            setattr(dist, name, delayed(saved_dist[name]))
        yield
    finally:
        for name, original in saved.items():
            setattr(c10d, name, original)
            setattr(dist, name, saved_dist[name])


def op_case(ctx: CaseContext, *, case_id: str, op: str, transpose_weight: bool = False,
            deterministic: bool = False, blocks_list: Sequence[Sequence[int] | None] = (None,),
            runs: int = 1, delays: bool = False, serial: bool = True) -> dict[str, Any]:
    """The op's results on this rank: one per (blocks, run), plus the references asked for."""
    import golden

    g = golden.load(case_id)
    args = operands(g, op, ctx.rank, ctx.world_size, transpose_weight=transpose_weight)
    fn = getattr(ctx.impl, op)
    kwargs: dict[str, Any] = {"group": ctx.group, "transpose_weight": transpose_weight}
    if deterministic:
        kwargs["deterministic"] = True
    results = []
    for index, blocks in enumerate(blocks_list):
        extra = {} if blocks is None else {"blocks": list(blocks)}
        for run in range(runs):
            seed = hash((ctx.rank, index, run)) if delays else 0
            with random_delays(seed) if delays else _nothing():
                results.append(fn(args["x"], args["w"], args["bias"], **kwargs, **extra))
    out: dict[str, Any] = {"results": results}
    if serial:
        out["serial"] = serial_composition(ctx, op, args["x"], _kn(args["w"], transpose_weight),
                                           args["bias"])
    if deterministic:
        out["reference"] = deterministic_reference(ctx, op, args["x"], _kn(args["w"], transpose_weight),
                                                   args["bias"])
    return out


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _kn(w: Any, transpose_weight: bool) -> Any:
    return w.T.contiguous() if transpose_weight else w


def serial_composition(ctx: CaseContext, op: str, x: Any, w: Any, bias: Any) -> Any:
    """The plain path in the op's dtype: matmul, then the collective (or the reverse)."""
    import torch
    import torch.distributed as dist

    tp, group = ctx.world_size, ctx.group
    if op in ("all_gather_matmul", "all_gather_matmul_v2"):
        gathered = torch.empty((x.shape[0] * tp, x.shape[1]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
        y = gathered @ w
        y = y if bias is None else y + bias
        return (y, gathered) if op == "all_gather_matmul_v2" else y
    y = x @ w
    if op == "matmul_all_reduce":
        dist.all_reduce(y, group=group)
    else:
        shard_out = torch.empty((y.shape[0] // tp, y.shape[1]), dtype=y.dtype, device=y.device)
        dist.reduce_scatter_tensor(shard_out, y.contiguous(), group=group)
        y = shard_out
    return y if bias is None else y + bias


def deterministic_reference(ctx: CaseContext, op: str, x: Any, w: Any, bias: Any) -> Any:
    """The serial deterministic result (module docstring) for this rank."""
    import torch
    import torch.distributed as dist

    tp = ctx.world_size
    partial = x.float() @ w.float().contiguous()
    gathered = torch.empty((tp * partial.shape[0], partial.shape[1]), dtype=torch.float32)
    dist.all_gather_into_tensor(gathered, partial.contiguous(), group=ctx.group)
    parts = gathered.view(tp, *partial.shape)
    total = parts[0].clone()
    for r in range(1, tp):
        total = total + parts[r]
    if op == "matmul_reduce_scatter":
        total = total.chunk(tp, dim=0)[ctx.rank]
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype)


def quant_case(ctx: CaseContext, *, case_id: str, ignore_offset: bool = False) -> dict[str, Any]:
    """w8A16 matmul_all_reduce on this rank and its live serial composition."""
    import torch.distributed as dist

    import golden
    from golden import serial

    g = golden.load(case_id)
    p, tp, rank = g.params, ctx.world_size, ctx.rank
    dtype = g.dtype
    x = shard(g.tensor("x"), Split.LAST, rank, tp)
    w = shard(g.tensor("w"), Split.SEQ, rank, tp)
    grouped = p["granularity"] == "per_group"
    scale = g.tensor("scale")
    offset = g.tensor("offset") if "offset" in g.inputs else None
    if grouped:  # group rows follow their k rows (k/tp is a multiple of g)
        scale = shard(scale, Split.SEQ, rank, tp)
        offset = None if offset is None else shard(offset, Split.SEQ, rank, tp)
    bias = g.tensor("bias") if "bias" in g.inputs else None
    group_size = p["group_size"] or 0
    y = ctx.impl.matmul_all_reduce(x, w, bias, group=ctx.group, antiquant_scale=scale,
                                   antiquant_offset=offset, antiquant_group_size=group_size)
    ref = x @ serial.dequantize(w, scale, offset, group_size or None).to(dtype)
    dist.all_reduce(ref, group=ctx.group)
    return {"y": y, "serial": ref if bias is None else ref + bias}


def bad_quant_call(ctx: CaseContext, *, case_id: str, change: str) -> dict[str, Any]:
    """Call w8A16 matmul_all_reduce with one argument made invalid; report the error."""
    import torch

    import golden

    g = golden.load(case_id)
    tp, rank = ctx.world_size, ctx.rank
    x = shard(g.tensor("x"), Split.LAST, rank, tp)
    w = shard(g.tensor("w"), Split.SEQ, rank, tp)
    k_local, n = w.shape
    kwargs: dict[str, Any] = {"antiquant_scale": torch.ones(n, dtype=x.dtype), "antiquant_offset": None,
                              "antiquant_group_size": 0}
    if change == "scale-shape":
        kwargs["antiquant_scale"] = torch.ones(n + 1, dtype=x.dtype)
    elif change == "offset-shape":
        kwargs["antiquant_offset"] = torch.ones(2, n, dtype=x.dtype)
    elif change == "offset-without-scale":
        kwargs.update(antiquant_scale=None, antiquant_offset=torch.ones(n, dtype=x.dtype))
    elif change == "group-not-multiple-of-32":
        kwargs.update(antiquant_group_size=48, antiquant_scale=torch.ones(-(-k_local // 48), n, dtype=x.dtype))
    elif change == "group-rows-wrong":
        kwargs.update(antiquant_group_size=32, antiquant_scale=torch.ones(k_local // 32 + 1, n, dtype=x.dtype))
    elif change == "group-not-below-k":
        kwargs.update(antiquant_group_size=k_local, antiquant_scale=torch.ones(1, n, dtype=x.dtype))
    elif change == "float32-activations":
        x = x.float()
        kwargs["antiquant_scale"] = torch.ones(n)
    elif change == "int8-without-scale":
        kwargs["antiquant_scale"] = None
    else:
        raise ValueError(change)
    try:
        ctx.impl.matmul_all_reduce(x, w, None, group=ctx.group, **kwargs)
        error = None
    except Exception as exc:  # noqa: BLE001 - the error is the result
        error = ([c.__name__ for c in type(exc).__mro__], str(exc))
    return {"error": error}
