"""The w8A16 kind: ``matmul_all_reduce`` with an int8 weight, every scale layout, or an argument made invalid.

A spec (:class:`QuantSpec`) names seeded inputs
(:class:`~conformance.contract.problems.QuantProblem`): sizes, the activation
dtype, per-tensor, per-channel or per-group scales (group sizes 32 to 256,
128 among them), with or without offset and bias, TP 1 to 4 -- or one of the
invalid arguments every implementation must refuse.  Judged by the fixed
suite's rules (:mod:`conformance.judge.quant_verdicts`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from conformance.cases.quant_cases import BAD_QUANT, quant_inputs, quant_task
from conformance.contract.jobs import QuantRun
from conformance.contract.problems import GRANULARITIES, QuantProblem
from conformance.explore import space
from conformance.explore.kind import Judged, Kind, Ranks, Scope, outcomes_to_judge, read_spec
from conformance.explore.space import Dimension, Space, size, smaller_ints, towards, weighted
from conformance.explore.spec import require_runnable
from conformance.judge.quant_verdicts import check_w8a16, judge_bad_argument, quant_truth
from conformance.record.levels import Level
from conformance.record.verdicts import Verdicts

KIND_NAME = "w8a16"
#: Activation dtypes of w8A16 (float32 activations are one of the invalid arguments).
ACTIVATIONS = ("float16", "bfloat16")
#: Group sizes: multiples of 32, the common 128 among them.
GROUP_SIZES = (32, 64, 96, 128, 160, 256)
#: The largest TP size a drawn case uses.
MAX_TP = 4
#: Invalid arguments that are invalid only where a rank's ``k`` is a multiple of 32 (one scale row too many).
WHOLE_GROUPS = ("group-rows-wrong",)
#: The check of a w8A16 call's numbers (the fixed suite's test-level check of the same rule).
NUMBERS = "w8A16 result matches the dequantised truth"


@dataclass(frozen=True)
class QuantSpec:
    """One w8A16 ``matmul_all_reduce`` on a TP group of ``tp`` ranks (``change``: an invalid argument instead)."""

    m: int
    k: int
    n: int
    tp: int
    dtype: str = "float16"
    granularity: str = "per_group"
    group_size: int = 32
    offset: bool = True
    bias: bool = True
    change: str = "none"
    seed: int = 0

    @property
    def world(self) -> int:
        return self.tp

    @property
    def capability(self) -> str:
        return "op:matmul_all_reduce/w8a16"

    def invalid(self) -> str:
        if min(self.m, self.k, self.n, self.tp) < 1 or self.k % self.tp:
            return f"sizes and tp must be positive, k={self.k} a multiple of tp={self.tp}"
        if self.dtype not in ACTIVATIONS or self.granularity not in GRANULARITIES or \
                self.change not in ("none", *BAD_QUANT):
            return f"dtype, granularity and change must be among {ACTIVATIONS}, {GRANULARITIES}, {BAD_QUANT}"
        if self.granularity == "per_group":
            k_local = self.k // self.tp
            if self.group_size % 32 or not 32 <= self.group_size < k_local or k_local % self.group_size:
                return (f"a group size is a multiple of 32, at least 32 and below a rank's k ({k_local}), which it "
                        f"divides: {self.group_size}")
        elif self.group_size:
            return "group_size is for per-group scales only"
        if self.change in WHOLE_GROUPS and (self.k // self.tp) % 32:
            return f"{self.change} is invalid only where a rank's k is a multiple of 32 (its groups of 32 are whole)"
        return ""

    def run(self) -> QuantRun:
        require_runnable(self)
        problem = QuantProblem(self.m, self.k, self.n, self.dtype, self.group_size, seed=self.seed,
                               granularity=self.granularity, offset=self.offset, bias=self.bias)
        return QuantRun(None, self.tp, change=None if self.change == "none" else self.change, seeded=problem)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND_NAME, **asdict(self)}

    def describe(self) -> str:
        layout = f"per_group g{self.group_size}" if self.granularity == "per_group" else self.granularity
        extras = "".join(f" +{name}" for name in ("offset", "bias") if getattr(self, name))
        change = f", invalid: {self.change}" if self.change != "none" else ""
        return f"w8A16 matmul_all_reduce tp{self.tp} {self.m}x{self.k}x{self.n} {self.dtype} {layout}{extras}{change}"


#: Fields of the spec, simplest value first.
DIMENSIONS = Space(
    Dimension("change", weighted(("none", *BAD_QUANT), (24,) + (1,) * len(BAD_QUANT)), towards("none", *BAD_QUANT)),
    Dimension("tp", weighted((1, 2, 3, 4), (1, 4, 2, 3)), lambda tp: [t for t in (1, 2, 3, 4) if t < tp]),
    Dimension("granularity", weighted(GRANULARITIES, (1, 1, 2)), towards(*GRANULARITIES)),
    Dimension("group_size", weighted(GROUP_SIZES, (2, 2, 1, 2, 1, 1)), towards(0, *GROUP_SIZES), absent=0),
    Dimension("m", size(32, 256, 1024), smaller_ints),
    Dimension("k", size(96, 512, 1536), smaller_ints),
    Dimension("n", size(64, 256, 768), smaller_ints),
    Dimension("dtype", weighted(ACTIVATIONS, (1, 1)), towards(*ACTIVATIONS)),
    Dimension("offset", weighted((False, True), (1, 1)), towards(False, True)),
    Dimension("bias", weighted((False, True), (1, 1)), towards(False, True)),
)


def fit(spec: QuantSpec, up: bool) -> QuantSpec:
    """``spec`` made runnable: ``k`` a multiple of ``tp`` (and, per group, of the group size on each rank, with at
    least two groups per rank), ``group_size`` 0 unless per group."""
    if spec.granularity != "per_group":
        step = spec.tp
        spec = replace(spec, group_size=0)
    else:
        spec = replace(spec, group_size=spec.group_size or GROUP_SIZES[0])
        step = spec.tp * spec.group_size
    if spec.change in WHOLE_GROUPS:
        step = math.lcm(step, spec.tp * 32)
    k = space.round_to(spec.k, step, up)
    if spec.granularity == "per_group" and k // spec.tp <= spec.group_size:
        k = 2 * step if up else k
    return replace(spec, k=k)


def offered(scope: Scope) -> str:
    return "" if scope.w8a16 else "matmul_all_reduce takes no w8A16 arguments"


#: Groups per rank of a per-group draw: mostly a few, often a dozen or two (a scale cache or a tiling sized for a
#: few groups breaks only past them).  Each range is a report bucket, drawn at its share; the last one is open (a
#: neighbour or a mutation may hold any number of groups).
GROUPS = (2, 4, 8, 16, 25)
GROUP_SHARES = (50, 20, 15, 15)


def more_groups(rng: random.Random) -> int:
    """Groups per rank of a per-group draw (:data:`GROUPS`)."""
    low, high = rng.choices(tuple(zip(GROUPS, GROUPS[1:])), GROUP_SHARES)[0]
    return rng.randint(low + (low != GROUPS[0]), high)


def groups_bucket(groups: int) -> str:
    """The report bucket of ``groups`` per rank (``none``: no per-group scales)."""
    if not groups:
        return "none"
    return next((f"<={top}" for top in GROUPS[1:-1] if groups <= top), f">{GROUPS[-2]}")


def draw(rng: random.Random, scope: Scope | None = None) -> QuantSpec:
    fields = DIMENSIONS.draw(rng)
    groups = more_groups(rng)
    if fields["granularity"] == "per_group":
        fields["k"] = fields["tp"] * fields["group_size"] * groups
    return fit(QuantSpec(**fields, seed=rng.randrange(1 << 16)), up=True)


def neighbours(spec: QuantSpec) -> Iterator[QuantSpec]:
    return space.valid_neighbours(spec, DIMENSIONS.simpler(spec), lambda c: fit(c, up=False))


def tags(spec: QuantSpec) -> list[str]:
    groups = spec.k // spec.tp // spec.group_size if spec.group_size else 0
    return DIMENSIONS.tags(spec) + [f"groups_per_rank={groups_bucket(groups)}"]


def buckets() -> dict[str, tuple[str, ...]]:
    """Every ``dimension=bucket`` :func:`tags` names, each one a draw reaches."""
    return {**DIMENSIONS.buckets(), "groups_per_rank": tuple(map(groups_bucket, (0, *GROUPS[1:])))}


def modes(spec: QuantSpec) -> frozenset[str]:
    """What of the implementation ``spec`` needs: w8A16 calls of its scales' granularity, with an offset or not."""
    return frozenset({spec.capability, spec.granularity} | ({"antiquant offset"} if spec.offset else set()))


def judge_spec(ranks: Ranks, spec: QuantSpec, scope: Scope, verdicts: Verdicts) -> Judged:
    """Run ``spec`` on ``ranks``: the numbers against the dequantised truth, or the refusal of its invalid argument."""
    run = spec.run()
    outcomes = outcomes_to_judge(ranks, spec, verdicts, quant_task, modes=modes(spec), run=run)
    if isinstance(outcomes, Judged):
        return outcomes
    if run.change is not None:
        judge_bad_argument(verdicts, outcomes, run.change, scope.declarations)
    else:
        with verdicts.check(NUMBERS, Level.MUST):
            quant = quant_inputs(run)
            check_w8a16(outcomes, run, quant, quant_truth(quant), evidence=verdicts.evidence)
    return Judged.of(verdicts)


def from_dict(data: dict[str, Any]) -> QuantSpec:
    """The spec of :meth:`QuantSpec.as_dict`."""
    return read_spec(QuantSpec, data)  # type: ignore[return-value]


KIND = Kind(KIND_NAME, weight=1.5, offered=offered, draw=draw, neighbours=neighbours, tags=tags, judge=judge_spec,
            from_dict=from_dict, spec_type=QuantSpec, buckets=buckets, modes=modes,
            subject=lambda spec: spec.change if spec.change != "none" else f"w8A16 {spec.granularity}")
