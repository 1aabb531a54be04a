"""The op kind: calls of the fused ops back to back, drawn over sizes, dtypes, TP layouts and modes.

A spec (:class:`OpSpec`) names global ``X [m, k] @ W [k, n] (+ bias)`` calls
by recipe (seeded data), so the same spec is the same case anywhere; it maps
to the suite's own job (:class:`~conformance.contract.jobs.OpRun`) and is
judged by the suite's own sequence (:func:`~conformance.judge.op_verdicts.judge_op_runs`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from conformance.cases.groups import GROUP_LAYOUTS
from conformance.cases.op_cases import op_task
from conformance.contract.jobs import OpRun
from conformance.contract.problems import Problem
from conformance.explore.kind import Judged, Kind, Ranks, Scope, run_to_the_end
from conformance.explore.space import (
    Dimension,
    draw_fields,
    field_tags,
    nothing_simpler,
    size,
    size_bucket,
    smaller_ints,
    towards,
    weighted,
)
from conformance.explore.spec import SpecError
from conformance.judge import ops as judge
from conformance.judge.checks import not_implemented
from conformance.judge.op_verdicts import judge_op_runs
from conformance.judge.verdicts import Verdicts
from conformance.protocol import FUSED_OPS
from golden.catalogue import DTYPES

#: The ops whose weight (``k``) is split over the TP ranks; the reduce-scatter also splits its rows.
K_SPLIT = ("matmul_all_reduce", "matmul_reduce_scatter")


@dataclass(frozen=True)
class Call:
    """One call of the op: global ``X [m, k] @ W [k, n] (+ bias)``, seeded data."""

    m: int
    k: int
    n: int
    dtype: str = "float32"
    bias: bool = True
    seed: int = 0


@dataclass(frozen=True)
class OpSpec:
    """Calls of one op back to back on a TP group of ``tp`` ranks in a world of ``tp * replicas``."""

    op: str
    calls: tuple[Call, ...]
    tp: int
    replicas: int = 1
    layout: str = "contiguous"
    transpose_weight: bool = False
    runs: int = 1
    straggler_s: float = 0.0

    @property
    def world(self) -> int:
        return self.tp * self.replicas

    @property
    def capability(self) -> str:
        return f"op:{self.op}"

    @property
    def split_sizes(self) -> tuple[str, ...]:
        """The sizes of a call the op splits over the TP ranks (each must be a multiple of ``tp``)."""
        return (("k",) if self.op in K_SPLIT else ()) + (("m",) if self.op != "matmul_all_reduce" else ())

    def problem(self, call: Call) -> str:
        """Why ``call`` cannot run in this spec ("" when it can)."""
        if min(call.m, call.k, call.n) < 1:
            return f"sizes must be positive: m={call.m} k={call.k} n={call.n}"
        odd = [f"{name}={getattr(call, name)}" for name in self.split_sizes if getattr(call, name) % self.tp]
        return f"{self.op} splits {' and '.join(odd)} over tp={self.tp}" if odd else ""

    def invalid(self) -> str:
        if self.op not in FUSED_OPS:
            return f"unknown op {self.op!r}; known: {FUSED_OPS}"
        if not self.calls or self.tp < 1 or self.replicas < 1 or self.runs < 1:
            return "a spec needs a call, tp, replicas and runs of at least 1"
        return next(filter(None, map(self.problem, self.calls)), "")

    def job(self) -> OpRun:
        """The suite's job for this spec (what ``op_task`` runs on every rank)."""
        why = self.invalid()
        if why:
            raise SpecError(why)
        problems = tuple(Problem(c.m, c.k, c.n, c.dtype, c.bias, seed=c.seed) for c in self.calls)
        return OpRun(self.op, problems, self.tp, layout=self.layout, transpose_weight=self.transpose_weight,
                     runs=self.runs, straggler_s=self.straggler_s)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND_NAME, **asdict(self)}

    def describe(self) -> str:
        calls = ", ".join(f"{c.m}x{c.k}x{c.n} {c.dtype}{' +bias' if c.bias else ''}" for c in self.calls)
        modes = [f"world {self.world} {self.layout}" if self.replicas > 1 else "",
                 "weight [n, k]" if self.transpose_weight else "", f"runs {self.runs}" if self.runs > 1 else "",
                 f"stragglers {self.straggler_s}s" if self.straggler_s else ""]
        return f"{self.op} tp{self.tp} [{calls}]" + "".join(f", {m}" for m in modes if m)


KIND_NAME = "op"

#: Fields of the spec.  ``tp`` weights favour 2 and 4, with 1 and 3 drawn too (sizes the fixed suite lacks).
SPEC_DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("op", weighted(FUSED_OPS, (1,) * len(FUSED_OPS)), nothing_simpler),
    Dimension("tp", weighted((1, 2, 3, 4), (1, 5, 2, 4)), lambda tp: [t for t in (1, 2, 3, 4) if t < tp]),
    Dimension("replicas", weighted((1, 2), (4, 1)), lambda r: [1] if r > 1 else []),
    Dimension("layout", weighted(GROUP_LAYOUTS, (1, 1)), towards(*GROUP_LAYOUTS)),
    Dimension("transpose_weight", weighted((False, True), (1, 1)), towards(False, True)),
    Dimension("runs", weighted((1, 2), (5, 1)), lambda r: [1] if r > 1 else []),
    Dimension("straggler_s", weighted((0.0, 0.002), (6, 1)), lambda s: [0.0] if s else []),
)
#: Fields of each call.
CALL_DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("m", size(48, 400, 2400), smaller_ints, size_bucket),
    Dimension("k", size(80, 320, 1024), smaller_ints, size_bucket),
    Dimension("n", size(80, 320, 1024), smaller_ints, size_bucket),
    Dimension("dtype", weighted(DTYPES, (1,) * len(DTYPES)), towards(*DTYPES)),
    Dimension("bias", weighted((False, True), (1, 1)), towards(False, True)),
)
#: How many calls a case makes back to back, and how often a call repeats the last one's shape (new data).
CALLS = weighted((1, 2, 3, 4, 5), (4, 2, 2, 1, 1))
REPEAT_SHAPE = 0.5
#: The largest world a drawn case uses: pools of 1 to 4 ranks stay warm together (10 ranks); TP 8 is the fixed
#: suite's, where a pool of 8 would evict the others at every draw.
MAX_WORLD = 4


def fit(spec: OpSpec, up: bool) -> OpSpec:
    """``spec`` with every size the op splits over the TP ranks rounded to a multiple of ``tp`` (up or down)."""
    def rounded(value: int) -> int:
        return max(spec.tp, -(-value // spec.tp) * spec.tp if up else value // spec.tp * spec.tp)

    calls = []
    for call in spec.calls:
        sizes: dict[str, Any] = {name: rounded(getattr(call, name)) for name in spec.split_sizes}
        calls.append(replace(call, **sizes))
    layout = spec.layout if spec.replicas > 1 else GROUP_LAYOUTS[0]
    return replace(spec, calls=tuple(calls), layout=layout)


def offered(scope: Scope) -> str:
    return "" if scope.ops else "the implementation provides none of the fused ops"


def draw(rng: random.Random, scope: Scope | None = None, ops: Sequence[str] | None = None) -> OpSpec:
    """One case from the space (only the ops of ``scope``, or ``ops``), valid by construction."""
    ops = ops or (scope.ops if scope is not None else FUSED_OPS)
    values = draw_fields(rng, SPEC_DIMENSIONS)
    values["op"] = values["op"] if values["op"] in ops else rng.choice(tuple(ops))
    while values["tp"] * values["replicas"] > MAX_WORLD:
        values["replicas"] = 1
    calls: list[Call] = []
    for _ in range(CALLS(rng)):
        seed = rng.randrange(1 << 16)
        if calls and rng.random() < REPEAT_SHAPE:
            calls.append(replace(calls[-1], seed=seed))
        else:
            calls.append(Call(**draw_fields(rng, CALL_DIMENSIONS), seed=seed))
    return fit(OpSpec(calls=tuple(calls), **values), up=True)


def neighbours(spec: OpSpec) -> Iterator[OpSpec]:
    """Every valid one-step-simpler spec: a call fewer, or one dimension of the spec, of the calls sharing a value,
    or of one call simpler."""
    seen = {spec}
    for candidate in _steps(spec):
        candidate = fit(candidate, up=False)
        if candidate not in seen and not candidate.invalid():
            seen.add(candidate)
            yield candidate


def _steps(spec: OpSpec) -> Iterable[OpSpec]:
    for i in range(len(spec.calls)):
        if len(spec.calls) > 1:
            yield replace(spec, calls=spec.calls[:i] + spec.calls[i + 1:])
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
    found = field_tags(spec, SPEC_DIMENSIONS) + [f"calls={len(spec.calls)}"]
    for call in spec.calls:
        found.extend(field_tags(call, CALL_DIMENSIONS))
    return found


def judge_spec(ranks: Ranks, spec: OpSpec, scope: Scope, verdicts: Verdicts) -> Judged:
    """Run ``spec`` on ``ranks`` and record the suite's checks of an op run into ``verdicts``."""
    run = spec.job()
    outcomes = run_to_the_end(ranks, spec, verdicts, op_task, run=run)
    if isinstance(outcomes, Judged):
        return outcomes
    skipped = not_implemented(judge.call_errors(outcomes))
    if skipped:
        return Judged(skipped=skipped)
    judge_op_runs(verdicts, [(run, outcomes)], scope.declarations.in_place_ops)
    return Judged.of(verdicts)


def from_dict(data: dict[str, Any]) -> OpSpec:
    """The spec of :meth:`OpSpec.as_dict`."""
    try:
        fields = dict(data)
        fields.pop("kind", None)
        calls = tuple(Call(**c) for c in fields.pop("calls"))
        spec = OpSpec(calls=calls, **fields)
    except (KeyError, TypeError) as exc:
        raise SpecError(f"malformed spec: {exc}") from None
    why = spec.invalid()
    if why:
        raise SpecError(why)
    return spec


KIND = Kind(KIND_NAME, weight=6.0, offered=offered, draw=draw, neighbours=neighbours, tags=tags, judge=judge_spec,
            from_dict=from_dict, spec_type=OpSpec)
