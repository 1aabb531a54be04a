"""Rank-side tasks of the fused-op checks (``docs/DESIGN.md#fused-ops``).

:func:`op_task` runs one :class:`OpRun`: on this rank's TP group (the whole
world, or a proper subgroup with other replicas beside it), it shards each
problem's global operands, calls the implementation's op once per problem --
back to back, with no synchronisation in between -- keeps every result, and
only then compares what it can compare on the rank (results changed after
they were returned, inputs changed by the call, memory shared between
results or with inputs, collectives left pending).  On request it adds the
live serial composition (matmul, then the collective, in the same dtype) and
the serial deterministic reference, defined here independently of any
implementation::

    P_r = x_r.float() @ w_r.float()            (the rank's fp32 partial)
    S   = (((P_0 + P_1) + P_2) + ...)          (ascending rank order, fp32)
    out = (S + bias.float()).to(dtype)         (bias once, one final cast)

with ``w_r`` the logical ``[k, n]`` weight, contiguous; for reduce-scatter
rank ``r`` keeps rows ``r*m/tp : (r+1)*m/tp`` of ``out``.

Fresh allocations are poisoned while the implementation runs (NaN for
floats), so rows it never writes cannot pass by luck.  Delays can be
injected on one rank or on random ranks, before the call and before every
collective inside it (:class:`~conformance.harness.probes.Straggler`).
"""

from __future__ import annotations

import contextlib
import random
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conformance.cases.data import Problem, global_operands
from conformance.cases.groups import TPPlace, tp_place
from conformance.cases.results import Timeline, timeline_of
from conformance.harness.case import IMPL, REFERENCE, CapturedError, RankContext, call_capturing_errors
from conformance.harness.probes import Straggler, record_collectives
from conformance.judge.layouts import Split, shard

#: How each op's operands are split over the TP ranks (global X [m, k], W [k, n]).
OPERAND_SPLITS = {
    "matmul_all_reduce": {"x": Split.LAST, "w": Split.SEQ, "y": Split.FULL},
    "matmul_reduce_scatter": {"x": Split.LAST, "w": Split.SEQ, "y": Split.SEQ},
    "all_gather_matmul": {"x": Split.SEQ, "w": Split.FULL, "y": Split.FULL},
    "all_gather_matmul_v2": {"x": Split.SEQ, "w": Split.FULL, "y": Split.FULL},
}
GATHERS = ("all_gather_matmul", "all_gather_matmul_v2")


@dataclass(frozen=True)
class OpRun:
    """What :func:`op_task` does: calls of one op on one TP layout, and the references it adds."""

    op: str
    problems: tuple[Problem, ...]  #: one call per problem, back to back
    tp: int
    layout: str = "contiguous"
    transpose_weight: bool = False
    deterministic: bool = False
    #: Explicit tilings (``blocks=``) each problem is called with; None: the implementation's own.
    tilings: tuple[tuple[int, ...] | None, ...] = (None,)
    runs: int = 1
    #: Longest injected delay (seconds); 0: none.  ``straggler_rank`` None: random ranks.
    straggler_s: float = 0.0
    straggler_rank: int | None = None
    serial: bool = True
    reference: bool = False
    poison: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  #: more keyword arguments of the op (w8A16)


@dataclass
class OpCall:
    """One problem's calls on one rank: results (per tiling and run) and what the rank observed."""

    results: list[Any]
    error: CapturedError | None = None
    serial: Any = None
    reference: Any = None
    mutated: dict[str, str] = field(default_factory=dict)
    changed_after_return: list[str] = field(default_factory=list)
    shared_memory: list[str] = field(default_factory=list)
    wrong_device: list[str] = field(default_factory=list)
    timelines: list[Timeline] = field(default_factory=list)


@dataclass
class OpRunOutcome:
    """Every call of an :class:`OpRun` on one rank, and where the rank sits."""

    calls: list[OpCall]
    replica: int
    tp_rank: int
    members: tuple[int, ...]
    groups_created: int = 0  #: process groups that appeared after the first call (a leak per call)


def rank_operands(problem: Problem, op: str, place: TPPlace, transpose_weight: bool) -> dict[str, Any]:
    """This rank's x, w (stored ``[n, k]`` when ``transpose_weight``) and bias."""
    whole = global_operands(problem, place.replica)
    splits = OPERAND_SPLITS[op]
    x = shard(whole["x"], splits["x"], place.tp_rank, place.tp)
    w = shard(whole["w"], splits["w"], place.tp_rank, place.tp)
    if transpose_weight:
        w = w.T.contiguous()
    bias = whole["bias"].clone() if whole["bias"] is not None else None
    return {"x": x, "w": w, "bias": bias}


@contextlib.contextmanager
def poisoned_allocations(on: bool = True) -> Iterator[None]:
    """Fresh tensors are filled with NaN (floats) / the largest value (ints) inside the block."""
    import torch
    import torch.utils.deterministic as det

    if not on:
        yield
        return
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        yield
    finally:
        det.fill_uninitialized_memory = was_fill  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _span(t: Any) -> tuple[int, int]:
    start = t.data_ptr()
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1 if t.numel() else 0
    return start, start + extent * t.element_size()


def _overlaps(a: Any, b: Any) -> bool:
    (s1, e1), (s2, e2) = _span(a), _span(b)
    return a.numel() > 0 and b.numel() > 0 and s1 < e2 and s2 < e1


def _to_cpu(value: Any) -> Any:
    """Results travel to the test process on the host (it need not have the device's runtime)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach() if value.device.type == "meta" else value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def op_task(ctx: RankContext, *, run: OpRun) -> OpRunOutcome:
    """Run ``run`` on this rank (module docstring)."""
    import torch.distributed as dist

    from conformance.judge.checks import bitwise_equal, describe_difference

    ctx.budget_from(0.0)  # the serial references: the floor, until their time is known
    place = tp_place(ctx, run.tp, run.layout)
    fn = getattr(ctx.impl, run.op)
    kwargs: dict[str, Any] = {"group": place.group, "transpose_weight": run.transpose_weight, **run.extra}
    if run.deterministic:
        kwargs["deterministic"] = True
    operands = [rank_operands(p, run.op, place, run.transpose_weight) for p in run.problems]
    calls = [OpCall([]) for _ in run.problems]
    start = time.perf_counter()
    with ctx.timer(REFERENCE):
        for call, args in zip(calls, operands):
            if run.serial:
                call.serial = serial_composition(place, run.op, args["x"], _kn(args["w"], run.transpose_weight),
                                                 args["bias"])
            if run.reference:
                call.reference = deterministic_reference(place, run.op, args["x"],
                                                         _kn(args["w"], run.transpose_weight), args["bias"])
    serial_s = (time.perf_counter() - start) / max(1, len(run.problems))
    ctx.budget_from(serial_s, calls=len(run.problems) * len(run.tilings) * run.runs)
    kept_inputs = [{name: _clone(t) for name, t in args.items()} for args in operands]
    straggler = _straggler(ctx, run)
    returned: list[list[tuple[Any, Any]]] = [[] for _ in calls]  # (result, its copy when returned)
    groups_after_first: int | None = None
    for index, (call, args) in enumerate(zip(calls, operands)):
        for tiling in run.tilings:
            extra = {} if tiling is None else {"blocks": list(tiling)}
            for _ in range(run.runs):
                if call.error is not None:
                    break
                if straggler is not None:
                    straggler()  # arrive late at the call itself
                with record_collectives(straggler) as log, poisoned_allocations(run.poison), ctx.timer(IMPL):
                    result, error = call_capturing_errors(fn, args["x"], args["w"], args["bias"], **kwargs, **extra)
                call.timelines.append(timeline_of(log))
                call.error = error
                if error is None:
                    returned[index].append((result, _clone(result)))
        if index == 0:
            groups_after_first = len(dist.distributed_c10d._world.pg_map)
        if call.error is not None:
            break
    groups_created = len(dist.distributed_c10d._world.pg_map) - (groups_after_first or 0)
    # Only now, with every call made, look at what was returned.
    for i, call in enumerate(calls):
        for name, before in kept_inputs[i].items():
            now = operands[i][name]
            if before is not None and not bitwise_equal(before, now):
                call.mutated[name] = describe_difference(before, now)
        for j, (result, snapshot) in enumerate(returned[i]):
            call.results.append(result)
            device = operands[i]["x"].device
            moved = [t.device for t in _tensors(result) if t.device != device]
            call.wrong_device.append(f"the result is on {moved[0]}, its inputs on {device}" if moved else "")
            if moved:  # nothing more can be compared on this rank
                call.changed_after_return.append("")
                call.shared_memory.append("")
                continue
            call.changed_after_return.append(
                "" if bitwise_equal(snapshot, result) else describe_difference(snapshot, result))
            call.shared_memory.append(", ".join(_sharing(result, (i, j), returned, operands)))
        call.results = [_to_cpu(r) for r in call.results]
        call.serial, call.reference = _to_cpu(call.serial), _to_cpu(call.reference)
    return OpRunOutcome(calls, place.replica, place.tp_rank, place.members,
                        groups_created=groups_created if groups_after_first is not None else 0)


def _sharing(result: Any, me: tuple[int, int], returned: list[list[tuple[Any, Any]]],
             operands: list[dict[str, Any]]) -> list[str]:
    """What else ``result`` shares memory with: other calls' results, any call's inputs."""
    mine = _tensors(result)
    found = []
    for i, pairs in enumerate(returned):
        for j, (other, _) in enumerate(pairs):
            if (i, j) != me and any(_overlaps(a, b) for a in mine for b in _tensors(other)):
                found.append(f"the result of call {i}" + (f" (repeat {j})" if j else ""))
    for i, args in enumerate(operands):
        for name, tensor in args.items():
            if tensor is not None and any(_overlaps(a, tensor) for a in mine):
                found.append(f"input {name!r} of call {i}")
    return found


def _straggler(ctx: RankContext, run: OpRun) -> Straggler | None:
    if run.straggler_s <= 0:
        return None
    seed = zlib.crc32(f"{ctx.rank}/{run.op}/{run.tp}".encode())
    if run.straggler_rank is not None:
        return Straggler(run.straggler_s, seed) if ctx.rank == run.straggler_rank else None
    return Straggler(run.straggler_s, seed, probability=random.Random(seed).uniform(0.3, 0.9))


def _kn(w: Any, transpose_weight: bool) -> Any:
    return w.T.contiguous() if transpose_weight else w


def serial_composition(place: TPPlace, op: str, x: Any, w: Any, bias: Any) -> Any:
    """The plain path in the op's dtype: matmul, then the collective (or the reverse)."""
    import torch
    import torch.distributed as dist

    tp, group = place.tp, place.group
    if op in GATHERS:
        gathered = torch.empty((x.shape[0] * tp, x.shape[1]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
        y = gathered @ w
        y = y if bias is None else y + bias
        return (y, gathered) if op == "all_gather_matmul_v2" else y
    y = x @ w
    if op == "matmul_all_reduce":
        dist.all_reduce(y, group=group)
    else:
        if y.shape[0] % tp:
            return None  # no serial layout exists: the implementation must refuse
        shard_out = torch.empty((y.shape[0] // tp, y.shape[1]), dtype=y.dtype, device=y.device)
        dist.reduce_scatter_tensor(shard_out, y.contiguous(), group=group)
        y = shard_out
    return y if bias is None else y + bias


def deterministic_reference(place: TPPlace, op: str, x: Any, w: Any, bias: Any) -> Any:
    """The serial deterministic result (module docstring) for this rank."""
    import torch
    import torch.distributed as dist

    tp = place.tp
    partial = x.float() @ w.float().contiguous()
    gathered = torch.empty((tp * partial.shape[0], partial.shape[1]), dtype=torch.float32)
    dist.all_gather_into_tensor(gathered, partial.contiguous(), group=place.group)
    parts = gathered.view(tp, *partial.shape)
    total = parts[0].clone()
    for r in range(1, tp):
        total = total + parts[r]
    if op == "matmul_reduce_scatter":
        total = total.chunk(tp, dim=0)[place.tp_rank]
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype)


@dataclass(frozen=True)
class QuantRun:
    """A w8A16 ``matmul_all_reduce`` of one golden case, or one made invalid by ``change``."""

    case_id: str
    tp: int
    change: str | None = None


def quant_task(ctx: RankContext, *, run: QuantRun) -> OpCall:
    """w8A16 matmul_all_reduce on this rank and its live serial composition (or the refused call)."""
    import torch.distributed as dist

    import golden
    from golden import serial

    ctx.budget_from(0.0)  # the floor, until the serial reference's time is known
    g = golden.load(run.case_id)
    p, tp, rank = g.params, ctx.world_size, ctx.rank
    x = shard(g.tensor("x"), Split.LAST, rank, tp)
    w = shard(g.tensor("w"), Split.SEQ, rank, tp)
    grouped = p["granularity"] == "per_group"
    scale = g.tensor("scale")
    offset = g.tensor("offset") if "offset" in g.inputs else None
    if grouped:  # group rows follow their k rows (k/tp is a multiple of g)
        scale = shard(scale, Split.SEQ, rank, tp)
        offset = None if offset is None else shard(offset, Split.SEQ, rank, tp)
    bias = g.tensor("bias") if "bias" in g.inputs else None
    kwargs: dict[str, Any] = {"antiquant_scale": scale, "antiquant_offset": offset,
                              "antiquant_group_size": p["group_size"] or 0}
    call = OpCall([])
    if run.change is not None:
        x, bias, kwargs = _invalid(run.change, x, w, kwargs)
    else:
        with ctx.timer(REFERENCE):
            start = time.perf_counter()
            ref = x @ serial.dequantize(w, scale, offset, p["group_size"]).to(g.dtype)
            dist.all_reduce(ref, group=ctx.group)
            call.serial = ref if bias is None else ref + bias
        ctx.budget_from(time.perf_counter() - start)
    with record_collectives() as log, poisoned_allocations(), ctx.timer(IMPL):
        result, call.error = call_capturing_errors(ctx.impl.matmul_all_reduce, x, w, bias, group=ctx.group, **kwargs)
    call.timelines.append(timeline_of(log))
    if call.error is None:
        call.results.append(result)
    return call


#: Invalid w8A16 arguments, each refused with a message naming what is wrong.
BAD_QUANT = ("scale-shape", "offset-shape", "offset-without-scale", "group-not-multiple-of-32",
             "group-rows-wrong", "group-not-below-k", "float32-activations", "int8-without-scale")


def _invalid(change: str, x: Any, w: Any, kwargs: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    import torch

    k_local, n = w.shape
    kwargs = {"antiquant_scale": torch.ones(n, dtype=x.dtype), "antiquant_offset": None, "antiquant_group_size": 0}
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
    return x, None, kwargs
