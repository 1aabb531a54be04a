"""Rank-side task of the fused-op checks (``docs/DESIGN.md#fused-ops``).

:func:`op_task` runs one :class:`~conformance.contract.jobs.OpRun`: on this
rank's TP group (the whole world, or a proper subgroup with other replicas
beside it), it shards each problem's global operands, calls the
implementation's op once per problem -- back to back, with no synchronisation
in between -- keeps every result, and only then compares what it can compare
on the rank (results changed after they were returned, inputs changed by the
call, memory shared between results or with inputs, collectives left
pending).  :func:`op_sequence_task` does the same for several runs of
different ops one after the other, comparing only after the last.  Operands
can be laid out with other strides than contiguous ones
(:data:`~conformance.contract.jobs.OPERAND_STRIDES`), NaN around each view.  On request it adds the suite's serial
reference (:mod:`conformance.cases.references`).

Fresh allocations are poisoned while the implementation runs
(:mod:`conformance.cases.memory`), so rows it never writes cannot pass by
luck.  Delays can be injected on one rank or on random ranks, before the call
and before every collective inside it (:class:`~conformance.harness.stragglers.Straggler`).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from conformance.cases.groups import TPPlace, tp_place
from conformance.cases.memory import clone, overlaps, poisoned_allocations, tensors_of, to_cpu, to_device
from conformance.cases.references import serial_composition
from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OPERAND_STRIDES, OpRun
from conformance.contract.layouts import OPERAND_SPLITS, shard
from conformance.contract.problems import Problem, global_operands
from conformance.contract.results import OpCallResults, OpRunOutcome
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.case import IMPL, REFERENCE, RankContext
from conformance.harness.observed import observed_collectives
from conformance.harness.probes import record_collectives
from conformance.harness.stragglers import Straggler


def rank_operands(problem: Problem, op: str, place: TPPlace, transpose_weight: bool,
                  strides: str = "contiguous", device: str = "cpu") -> dict[str, Any]:
    """This rank's x, w (stored ``[n, k]`` when ``transpose_weight``) and bias on ``device``, laid out as
    ``strides`` says (drawn on the CPU from the problem's seed, so every device sees the same numbers)."""
    whole = to_device(global_operands(problem, place.replica), device)
    splits = OPERAND_SPLITS[op]
    x = shard(whole["x"], splits["x"], place.tp_rank, place.tp)
    w = shard(whole["w"], splits["w"], place.tp_rank, place.tp)
    if transpose_weight:
        w = w.T.contiguous()
    bias = whole["bias"].clone() if whole["bias"] is not None else None
    if strides == "weight-view":
        w = w.t().contiguous().t()
    elif strides == "sliced":
        x, w = _column_slice(x), _column_slice(w)
    elif strides == "offset":
        x, w, bias = _at_offset(x), _at_offset(w), _at_offset(bias)
    elif strides != "contiguous":
        raise ValueError(f"unknown operand strides {strides!r}; expected one of {OPERAND_STRIDES}")
    return {"x": x, "w": w, "bias": bias}


#: NaN padding around strided operands: an implementation reading past a view reads NaN, never plausible values.
_PAD = 3


def _column_slice(t: Any) -> Any:
    """``t``'s values as a column slice of a wider buffer: row stride > row length, storage offset > 0."""
    import torch

    wide = torch.full((t.shape[0], t.shape[1] + 2 * _PAD), float("nan"), dtype=t.dtype, device=t.device)
    wide[:, _PAD:_PAD + t.shape[1]] = t
    return wide[:, _PAD:_PAD + t.shape[1]]


def _at_offset(t: Any) -> Any:
    """``t``'s values, contiguous, at a storage offset into a longer buffer."""
    import torch

    if t is None:
        return None
    flat = torch.full((t.numel() + 2 * _PAD,), float("nan"), dtype=t.dtype, device=t.device)
    flat[_PAD:_PAD + t.numel()] = t.reshape(-1)
    return flat[_PAD:_PAD + t.numel()].view(t.shape)


@dataclass
class _Calls:
    """One run's state on this rank: its operands, what each call returned, what the rank saw."""

    run: OpRun
    place: TPPlace
    operands: list[dict[str, Any]]
    calls: list[OpCallResults]
    kept_inputs: list[dict[str, Any]] = field(default_factory=list)
    #: Per call, per attempt: (its result, a copy taken when it was returned); None where the attempt raised.
    returned: list[list[tuple[Any, Any] | None]] = field(default_factory=list)
    groups_created: int = 0


def op_task(ctx: RankContext, *, run: OpRun) -> OpRunOutcome:
    """Run ``run`` on this rank (module docstring)."""
    return op_sequence_task(ctx, runs=(run,))[0]


def op_sequence_task(ctx: RankContext, *, runs: tuple[OpRun, ...]) -> list[OpRunOutcome]:
    """Every run's calls, run after run (op after op, with no synchronisation between), all results kept.

    Only once the last call of the last run returned is anything compared, so a
    later op that overwrites an earlier op's result (a workspace shared between
    ops) is seen.
    """
    ctx.budget_from(0.0)  # the serial references: the floor, until their time is known
    started = time.perf_counter()
    states = [_prepare(ctx, run) for run in runs]
    calls = sum(len(r.problems) * len(r.tilings) * r.runs for r in runs)
    ctx.budget_from((time.perf_counter() - started) / max(1, sum(len(r.problems) for r in runs)), calls=calls)
    for state in states:
        state.kept_inputs = [{name: clone(t) for name, t in args.items()} for args in state.operands]
    for state in states:
        _call(ctx, state)
    everything = [(state.run.op, state.returned) for state in states]
    return [_collect(state, index, everything) for index, state in enumerate(states)]


def _prepare(ctx: RankContext, run: OpRun) -> _Calls:
    """This rank's operands of ``run`` and the suite's references, computed before any call."""
    place = tp_place(ctx, run.tp, run.layout)
    operands = [rank_operands(p, run.op, place, run.transpose_weight, run.strides, ctx.device) for p in run.problems]
    calls = [OpCallResults([]) for _ in run.problems]
    with ctx.timer(REFERENCE):
        for call, args in zip(calls, operands):
            if run.serial:
                call.serial = serial_composition(place, run.op, args["x"], _kn(args["w"], run.transpose_weight),
                                                 args["bias"])
    return _Calls(run, place, operands, calls)


def _call(ctx: RankContext, state: _Calls) -> None:
    """Every call of the run, back to back, each problem under each tiling run after run (each one *attempt*); each
    result kept with a copy taken when it was returned, each error beside it.  An attempt that raised stops none
    of the others: every result that comes back is judged (``conformance/judge/attempts.py``)."""
    import torch.distributed as dist

    run = state.run
    fn = getattr(ctx.impl, run.op)
    kwargs: dict[str, Any] = {"group": state.place.group, "transpose_weight": run.transpose_weight, **run.extra}
    if run.deterministic:
        kwargs["deterministic"] = True
    straggler = _straggler(ctx, run)
    state.returned = [[] for _ in state.calls]
    groups_after_first: int | None = None
    for index, (call, args) in enumerate(zip(state.calls, state.operands)):
        for tiling in run.tilings:
            extra = {} if tiling is None else {"blocks": list(tiling)}
            for _ in range(run.runs):
                if straggler is not None:
                    straggler()  # arrive late at the call itself
                # not synchronised: the calls run back to back, and each result is copied as it was returned
                with record_collectives(straggler) as log, poisoned_allocations(run.poison, ctx.device), \
                        ctx.timer(IMPL, synchronized=False):
                    result, error = call_capturing_errors(fn, args["x"], args["w"], args["bias"], **kwargs, **extra)
                call.timelines.append(observed_collectives(log))
                call.errors.append(error)
                state.returned[index].append(None if error is not None else (result, clone(result)))
        if index == 0:
            groups_after_first = len(dist.distributed_c10d._world.pg_map)
    if groups_after_first is not None:
        state.groups_created = len(dist.distributed_c10d._world.pg_map) - groups_after_first


def _collect(state: _Calls, run_index: int,
             everything: list[tuple[str, list[list[tuple[Any, Any] | None]]]]) -> OpRunOutcome:
    """What the rank compares once every call of every run was made."""
    operands = state.operands
    for i, call in enumerate(state.calls):
        for name, before in state.kept_inputs[i].items():
            now = operands[i][name]
            if before is not None and not bitwise_equal(before, now):
                call.mutated[name] = describe_difference(before, now)
        for j, kept in enumerate(state.returned[i]):
            if kept is None:  # the attempt raised: nothing came back to compare
                call.results.append(None)
                call.wrong_device.append("")
                call.changed_after_return.append("")
                call.shared_memory.append("")
                continue
            result, snapshot = kept
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
            call.shared_memory.append(", ".join(_sharing(result, (run_index, i, j), everything, operands)))
        call.results = [to_cpu(r) for r in call.results]
        call.serial = to_cpu(call.serial)
    return OpRunOutcome(state.calls, state.place.replica, state.place.tp_rank, state.place.members,
                        groups_created=state.groups_created)


def _sharing(result: Any, me: tuple[int, int, int],
             everything: list[tuple[str, list[list[tuple[Any, Any] | None]]]],
             operands: list[dict[str, Any]]) -> list[str]:
    """What else ``result`` shares memory with: other calls' results (of any op run), its run's inputs."""
    mine = tensors_of(result)
    found = []
    for run, (op, returned) in enumerate(everything):
        for i, pairs in enumerate(returned):
            for j, kept in enumerate(pairs):
                if kept is None:
                    continue
                if (run, i, j) != me and any(overlaps(a, b) for a in mine for b in tensors_of(kept[0])):
                    found.append((f"the result of call {i}" if run == me[0] else f"the result of {op} call {i}")
                                 + (f" (repeat {j})" if j else ""))
    for i, args in enumerate(operands):
        for name, tensor in args.items():
            if tensor is not None and any(overlaps(a, tensor) for a in mine):
                found.append(f"input {name!r} of call {i}")
    return found


def _straggler(ctx: RankContext, run: OpRun) -> Straggler | None:
    launch = f"/launch {run.launch}" if run.launch else ""
    return Straggler.of_rank(ctx.rank, run.straggler_s, run.straggler_rank, f"{run.op}/{run.tp}{launch}",
                             lambda seed: random.Random(seed).uniform(0.3, 0.9))


def _kn(w: Any, transpose_weight: bool) -> Any:
    return w.T.contiguous() if transpose_weight else w


