"""The op kind: calls of the fused ops back to back, drawn over sizes, dtypes, TP layouts, strides and modes.

A spec (:class:`~conformance.explore.op_spec.OpSpec`: the case as data) is
drawn from the space below, simplified one step at a time, and judged by the
suite's own rules (:mod:`conformance.judge.op_verdicts`): a call that raised as a refusal, the
rest by the op checks, deterministic cases also bitwise (every run of a
tiling, and every tiling where declared split-invariant) -- on spread data,
at least two runs a tiling, never of exact data, where nothing could differ.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from conformance.cases.groups import GROUP_LAYOUTS
from conformance.cases.op_cases import op_sequence_task
from conformance.contract.jobs import OPERAND_STRIDES
from conformance.explore import space
from conformance.explore.kind import Judged, Kind, Ranks, Scope, read_spec, run_to_the_end
from conformance.explore.op_spec import KIND_NAME, TILINGS, Call, OpSpec, split_sizes
from conformance.explore.space import Dimension, Space, nothing_simpler, size, smaller_ints, towards, weighted
from conformance.judge.op_verdicts import judge_deterministic, judge_op_runs, sort_refusals
from conformance.protocol import DETERMINISTIC_OPS, FUSED_OPS
from conformance.record.verdicts import Verdicts
from golden.catalogue import DTYPES

#: Fields of the spec.  ``tp`` weights favour 2 and 4, with 1 and 3 drawn too (sizes the fixed suite lacks).
SPEC_DIMENSIONS = Space(
    Dimension("tp", weighted((1, 2, 3, 4), (1, 5, 2, 4)), lambda tp: [t for t in (1, 2, 3, 4) if t < tp]),
    Dimension("replicas", weighted((1, 2), (4, 1)), lambda r: [1] if r > 1 else []),
    Dimension("layout", weighted(GROUP_LAYOUTS, (1, 1)), towards(*GROUP_LAYOUTS)),
    Dimension("transpose_weight", weighted((False, True), (1, 1)), towards(False, True)),
    Dimension("strides", weighted(OPERAND_STRIDES, (9,) + (1,) * (len(OPERAND_STRIDES) - 1)),
              towards(*OPERAND_STRIDES)),
    Dimension("deterministic", weighted((False, True), (3, 1)), towards(False, True)),
    Dimension("exact", weighted((False, True), (2, 1)), towards(False, True)),
    Dimension("tiling", weighted(TILINGS, (6, 1, 1, 1)), towards(*TILINGS)),
    Dimension("runs", weighted((1, 2, 3), (8, 2, 1)), lambda r: list(range(1, r))),
    Dimension("straggler_s", weighted((0.0, 0.002), (6, 1)), lambda s: [0.0] if s else []),
)
#: Fields of each call.  A call's op is the previous call's, or (a sequence) another one now and then.
CALL_DIMENSIONS = Space(
    Dimension("m", size(48, 400, 2400), smaller_ints),
    Dimension("k", size(80, 320, 1024), smaller_ints),
    Dimension("n", size(80, 320, 1024), smaller_ints),
    Dimension("dtype", weighted(DTYPES, (1,) * len(DTYPES)), towards(*DTYPES)),
    Dimension("bias", weighted((False, True), (1, 1)), towards(False, True)),
    Dimension("op", weighted(FUSED_OPS, (1,) * len(FUSED_OPS)), nothing_simpler),
)
#: How many calls a case makes back to back, how often a call repeats the last one's shape (new data), and how
#: often a call is of another op than the last one.
CALLS = weighted((1, 2, 3, 4, 5), (4, 2, 2, 1, 1))
REPEAT_SHAPE = 0.5
ANOTHER_OP = 0.15
#: How often a call of another op takes the previous call's dtype and ``k``, and sizes so that its output has the
#: previous output's shape: where a buffer shared across ops (sized by shape and dtype) shows.
COINCIDE = 0.6
#: The largest world a drawn case uses: pools of 1 to 4 ranks stay warm together (10 ranks); TP 8 is the fixed
#: suite's, where a pool of 8 would evict the others at every draw.
MAX_WORLD = 4


def fit(spec: OpSpec, up: bool) -> OpSpec:
    """``spec`` made runnable: every size its ops split over the TP ranks rounded to a multiple of ``tp`` (up or
    down), modes only where they apply (a layout with replicas, determinism on its ops, a tiling where it fits),
    and determinism only where the case can fail (spread data, not exact, two runs at least, and the fixed suite's
    :func:`~conformance.judge.determinism.cannot_fail`: no TP 1 or 2)."""
    calls = []
    for call in spec.calls:
        sizes: dict[str, Any] = {name: space.round_to(getattr(call, name), spec.tp, up)
                                 for name in split_sizes(call.op)}
        calls.append(replace(call, **sizes))
    fitted = replace(spec, calls=tuple(calls), layout=spec.layout if spec.replicas > 1 else GROUP_LAYOUTS[0])
    if fitted.deterministic and not set(fitted.ops) <= set(DETERMINISTIC_OPS):
        fitted = replace(fitted, deterministic=False)
    if fitted.deterministic:
        fitted = replace(fitted, exact=False, runs=max(2, fitted.runs))
    if fitted.exact and any(fitted.problem(c) for c in fitted.calls):
        fitted = replace(fitted, exact=False)
    if fitted.tiling_problem():
        fitted = replace(fitted, tiling="own")
    if not any(map(fitted.problem, fitted.calls)) and fitted.cannot_fail():  # TP 1 or 2, data that cannot show
        fitted = replace(fitted, deterministic=False)
    return fitted


def offered(scope: Scope) -> str:
    return "" if scope.ops else "the implementation provides none of the fused ops"


def draw(rng: random.Random, scope: Scope | None = None, ops: Sequence[str] | None = None) -> OpSpec:
    """One case from the space (only the ops of ``scope``, or ``ops``), valid by construction."""
    ops = tuple(ops or (scope.ops if scope is not None else FUSED_OPS))
    values = SPEC_DIMENSIONS.draw(rng)
    while values["tp"] * values["replicas"] > MAX_WORLD:
        values["replicas"] = 1
    calls: list[Call] = []
    for _ in range(CALLS(rng)):
        seed = rng.randrange(1 << 16)
        if calls and rng.random() < REPEAT_SHAPE:
            calls.append(replace(calls[-1], seed=seed))
            continue
        call = Call(**CALL_DIMENSIONS.draw(rng), seed=seed)
        if call.op not in ops or (calls and rng.random() >= ANOTHER_OP):
            call = replace(call, op=calls[-1].op if calls else rng.choice(ops))
        elif calls and call.op != calls[-1].op and rng.random() < COINCIDE:
            call = coinciding(call, calls[-1], values["tp"])
        calls.append(call)
    spec = fit(OpSpec(calls=tuple(calls), **values), up=True)
    if spec.tiling != "own" and not set(spec.ops) <= scope_blocks(scope):
        spec = replace(spec, tiling="own")
    return spec


def scope_blocks(scope: Scope | None) -> set[str]:
    """The ops an explicit tiling may be drawn for."""
    return set(scope.blocks) if scope is not None else set(FUSED_OPS)


def output_rows(op: str, m: int, tp: int) -> int:
    """The rows of a call's result on a rank: a reduce-scatter's share, all ``m`` otherwise."""
    return m // tp if op == "matmul_reduce_scatter" else m


def coinciding(call: Call, previous: Call, tp: int) -> Call:
    """``call`` (of another op) with ``previous``'s dtype, ``k`` and ``n``, and ``m`` such that its result has the
    shape of ``previous``'s (and the same inputs' shape where the ops allow)."""
    rows = max(1, output_rows(previous.op, previous.m, tp))  # ``previous`` is not fitted yet: m may be below tp
    m = rows * tp if call.op == "matmul_reduce_scatter" else rows
    return replace(call, m=m, k=previous.k, n=previous.n, dtype=previous.dtype)


def shares_an_output_shape(spec: OpSpec) -> bool:
    """Whether two calls of different ops give results of one shape and dtype (a buffer shared across ops shows)."""
    outputs = {(c.op, output_rows(c.op, c.m, spec.tp), c.n, c.dtype) for c in spec.calls}
    return any(a[1:] == b[1:] and a[0] != b[0] for a in outputs for b in outputs)


def neighbours(spec: OpSpec) -> Iterator[OpSpec]:
    """Every valid one-step-simpler spec: a call fewer, or one dimension of the spec, of the calls sharing a value,
    or of one call simpler."""
    return space.valid_neighbours(spec, _steps(spec), lambda c: fit(c, up=False))


def _steps(spec: OpSpec) -> Iterable[OpSpec]:
    for i in range(len(spec.calls)):
        if len(spec.calls) > 1:
            yield replace(spec, calls=spec.calls[:i] + spec.calls[i + 1:])
    first = spec.calls[0].op
    for i, call in enumerate(spec.calls):  # a sequence: a call of the first call's op instead
        if call.op != first:
            yield replace(spec, calls=spec.calls[:i] + (replace(call, op=first),) + spec.calls[i + 1:])
    for d in SPEC_DIMENSIONS:
        for value in d.simpler(getattr(spec, d.name)):
            yield replace(spec, **{d.name: value})
    for d in CALL_DIMENSIONS:  # a value several calls share, simpler in all of them (keeps a repeated shape)
        shared = Counter(getattr(c, d.name) for c in spec.calls)
        for value in (v for v, count in shared.items() if count > 1):
            for simpler in d.simpler(value):
                yield replace(spec, calls=tuple(replace(c, **{d.name: simpler}) if getattr(c, d.name) == value else c
                                                for c in spec.calls))
    for i, call in enumerate(spec.calls):
        for d in CALL_DIMENSIONS:
            for value in d.simpler(getattr(call, d.name)):
                yield replace(spec, calls=spec.calls[:i] + (replace(call, **{d.name: value}),) + spec.calls[i + 1:])


def tags(spec: OpSpec) -> list[str]:
    """``dimension=bucket`` of each dimension of ``spec`` (the explored counts per dimension)."""
    found = SPEC_DIMENSIONS.tags(spec) + [f"calls={len(spec.calls)}"]
    if len(spec.ops) > 1:
        found.append(f"ops_share_an_output_shape={shares_an_output_shape(spec)}")
    for call in spec.calls:
        found.extend(CALL_DIMENSIONS.tags(call))
    return found


def buckets() -> dict[str, tuple[str, ...]]:
    """Every ``dimension=bucket`` :func:`tags` names, each one a draw reaches."""
    return {**SPEC_DIMENSIONS.buckets(), **CALL_DIMENSIONS.buckets(), "calls": CALLS.buckets,
            "ops_share_an_output_shape": ("False", "True")}


def judge_spec(ranks: Ranks, spec: OpSpec, scope: Scope, verdicts: Verdicts) -> Judged:
    """Run ``spec`` on ``ranks`` and record the suite's checks of op runs into ``verdicts``.

    By the one refusal rule of op cases (``sort_refusals``, the fixed
    suite's): a run whose every call raised ``NotImplementedError`` is a mode
    not offered; a call that raised where ``refusal_rule`` allows it (strided
    operands, an odd number of rows per rank) is judged as a refusal; any
    other call that raised fails "the op ran on every rank"; the other runs
    of a sequence are judged whatever one run did.  A deterministic case must
    also be bitwise reproducible, and split-invariant where the
    implementation declares it.
    """
    if spec.tiling != "own" and not set(spec.ops) <= scope.blocks:
        return Judged(skipped=f"{spec.ops} take no explicit tiling (blocks=)")
    runs = spec.jobs()
    outcomes = run_to_the_end(ranks, spec, verdicts, op_sequence_task, runs=runs)
    if isinstance(outcomes, Judged):
        return outcomes
    judged = [(run, [o[i] for o in outcomes]) for i, run in enumerate(runs)]
    sorted_runs = sort_refusals(verdicts, judged, scope.declarations)
    judge_op_runs(verdicts, sorted_runs.to_judge, scope.declarations.in_place_ops, exact=spec.exact)
    if spec.deterministic:
        judge_deterministic(verdicts, sorted_runs.to_judge, scope.declarations.split_invariant_ops)
    result = Judged.of(verdicts)
    if sorted_runs.not_offered:  # the other runs are judged all the same: their failures stand
        return replace(result, skipped=sorted_runs.not_offered[0][1], not_offered=frozenset().union(
            *(spec.modes((run.op,)) for run, _ in sorted_runs.not_offered)))
    return result


def from_dict(data: dict[str, Any]) -> OpSpec:
    """The spec of :meth:`OpSpec.as_dict`."""
    def convert(fields: dict[str, Any]) -> dict[str, Any]:
        if not fields.get("calls"):
            raise KeyError("calls")
        return {**fields, "calls": tuple(Call(**c) for c in fields["calls"])}

    return read_spec(OpSpec, data, convert)  # type: ignore[return-value]


KIND = Kind(KIND_NAME, weight=6.0, offered=offered, draw=draw, neighbours=neighbours, tags=tags, judge=judge_spec,
            from_dict=from_dict, spec_type=OpSpec, buckets=buckets, modes=lambda spec: spec.modes(),
            subject=lambda spec: "+".join(spec.ops))
