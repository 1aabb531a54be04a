"""Rank-side task of the fused-op checks (``docs/DESIGN.md#fused-ops``).

:func:`op_task` runs one :class:`~conformance.contract.jobs.OpRun`: on this
rank's TP group (the whole world, or a proper subgroup with other replicas
beside it), it shards each problem's global operands, calls the
implementation's op once per problem -- back to back, with no synchronisation
in between -- keeps every result, and only then compares what it can compare
on the rank (results changed after they were returned, inputs changed by the
call, memory shared between results or with inputs, collectives left
pending).  On request it adds the suite's references
(:mod:`conformance.cases.references`).

Fresh allocations are poisoned while the implementation runs
(:mod:`conformance.cases.memory`), so rows it never writes cannot pass by
luck.  Delays can be injected on one rank or on random ranks, before the call
and before every collective inside it (:class:`~conformance.harness.probes.Straggler`).
"""

from __future__ import annotations

import random
import time
import zlib
from typing import Any

from conformance.cases.groups import TPPlace, tp_place
from conformance.cases.memory import clone, overlaps, poisoned_allocations, tensors_of, to_cpu
from conformance.cases.references import deterministic_reference, serial_composition
from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OpRun
from conformance.contract.layouts import OPERAND_SPLITS, shard
from conformance.contract.problems import Problem, global_operands
from conformance.contract.results import OpCallResults, OpRunOutcome, observed_collectives
from conformance.harness.case import IMPL, REFERENCE, RankContext, call_capturing_errors
from conformance.harness.probes import Straggler, record_collectives


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


def op_task(ctx: RankContext, *, run: OpRun) -> OpRunOutcome:
    """Run ``run`` on this rank (module docstring)."""
    import torch.distributed as dist

    ctx.budget_from(0.0)  # the serial references: the floor, until their time is known
    place = tp_place(ctx, run.tp, run.layout)
    fn = getattr(ctx.impl, run.op)
    kwargs: dict[str, Any] = {"group": place.group, "transpose_weight": run.transpose_weight, **run.extra}
    if run.deterministic:
        kwargs["deterministic"] = True
    operands = [rank_operands(p, run.op, place, run.transpose_weight) for p in run.problems]
    calls = [OpCallResults([]) for _ in run.problems]
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
    kept_inputs = [{name: clone(t) for name, t in args.items()} for args in operands]
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
                call.timelines.append(observed_collectives(log))
                call.error = error
                if error is None:
                    returned[index].append((result, clone(result)))
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
            moved = [t.device for t in tensors_of(result) if t.device != device]
            call.wrong_device.append(f"the result is on {moved[0]}, its inputs on {device}" if moved else "")
            if moved:  # nothing more can be compared on this rank
                call.changed_after_return.append("")
                call.shared_memory.append("")
                continue
            call.changed_after_return.append(
                "" if bitwise_equal(snapshot, result) else describe_difference(snapshot, result))
            call.shared_memory.append(", ".join(_sharing(result, (i, j), returned, operands)))
        call.results = [to_cpu(r) for r in call.results]
        call.serial, call.reference = to_cpu(call.serial), to_cpu(call.reference)
    return OpRunOutcome(calls, place.replica, place.tp_rank, place.members,
                        groups_created=groups_created if groups_after_first is not None else 0)


def _sharing(result: Any, me: tuple[int, int], returned: list[list[tuple[Any, Any]]],
             operands: list[dict[str, Any]]) -> list[str]:
    """What else ``result`` shares memory with: other calls' results, any call's inputs."""
    mine = tensors_of(result)
    found = []
    for i, pairs in enumerate(returned):
        for j, (other, _) in enumerate(pairs):
            if (i, j) != me and any(overlaps(a, b) for a in mine for b in tensors_of(other)):
                found.append(f"the result of call {i}" + (f" (repeat {j})" if j else ""))
    for i, args in enumerate(operands):
        for name, tensor in args.items():
            if tensor is not None and any(overlaps(a, tensor) for a in mine):
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


