"""The layer kind: Megatron's column, row and MLP layers trained under the implementation's patch.

A spec (:class:`LayerSpec`) names a layer problem by recipe -- its sizes,
dtype, micro-batches of their own token counts, optimizer steps, chunk count,
gradient-accumulation fusion, autocast, TP group in a world of replicas,
stragglers -- and maps to the suite's own :class:`~conformance.contract.jobs.LayerJob`,
judged by the suite's own sequence (:mod:`conformance.judge.layer_verdicts`).
Where a rank's rows do not divide into the chunks (or are fewer), a clear
refusal on every rank is conforming, as in the fixed suite's uneven token counts.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from conformance.cases.layer_cases import AUTOCAST_LAYERS, layer_task
from conformance.contract.jobs import LayerJob, coc_argv
from conformance.contract.problems import LAYER_KINDS, LayerProblem
from conformance.explore import space
from conformance.explore.kind import Judged, Kind, Ranks, Scope, read_spec, run_to_the_end
from conformance.explore.space import Dimension, Space, size, smaller_ints, towards, weighted
from conformance.explore.spec import OnReplicas, require_runnable
from conformance.judge.layer_verdicts import (
    judge_layer_refusal,
    judge_training,
    layer_refusal_names,
    sort_layer_attempts,
)
from conformance.record.verdicts import NotOffered, Verdicts
from golden.catalogue import DTYPES

KIND_NAME = "layer"
#: The chunk counts ``--coc-parallel-num`` accepts (the configuration contract).
CHUNKS = (1, 2, 4, 8)
#: The dtype autocast runs float32 layers in (CPU autocast's; see ``AUTOCAST_LAYERS`` for the layers it runs).
AUTOCAST = (None, "bfloat16")
#: The largest world a drawn case uses (the op kind's: pools of 1 to 4 ranks stay warm together).
MAX_WORLD = 4


@dataclass(frozen=True)
class LayerSpec(OnReplicas):
    """A layer trained for ``steps`` optimizer steps of one micro-batch per entry of ``tokens``, CoC and serial."""

    layer: str
    sequence_parallel: bool
    tp: int
    h_in: int
    h_out: int
    tokens: tuple[int, ...]  #: each micro-batch's global sequence length
    ffn: int = 0  #: the MLP's hidden width (0 for one layer)
    replicas: int = 1
    dtype: str = "float32"
    bias: bool = True
    b: int = 1
    chunks: int = 2
    steps: int = 1
    main_grad: bool = False
    autocast: str | None = None
    straggler_s: float = 0.0
    seed: int = 0

    @property
    def capability(self) -> str:
        return f"layer:{self.layer}"

    def split_sizes(self) -> tuple[str, ...]:
        """The sizes the layer splits over the TP ranks."""
        return {"column": ("h_out",), "row": ("h_in",), "mlp": ("ffn",)}[self.layer]

    def rows(self) -> list[int]:
        """Each micro-batch's rows on one rank (the sequence shard with SP)."""
        return [(s // self.tp if self.sequence_parallel else s) * self.b for s in self.tokens]

    def uneven(self) -> bool:
        """Whether some micro-batch's rows per rank do not divide into the chunks (a refusal may be conforming)."""
        return any(r % self.chunks or r < self.chunks for r in self.rows())

    def invalid(self) -> str:
        if self.layer not in LAYER_KINDS:
            return f"unknown layer {self.layer!r}; known: {LAYER_KINDS}"
        if min(self.tp, self.replicas, self.h_in, self.h_out, self.b, self.steps, *self.tokens, 1) < 1 or \
                not self.tokens:
            return "tp, replicas, sizes, b, steps and every token count must be at least 1"
        if (self.layer == "mlp") != (self.ffn > 0):
            return "ffn is the MLP's hidden width: positive for the mlp layer, 0 otherwise"
        odd = [f"{name}={getattr(self, name)}" for name in self.split_sizes() if getattr(self, name) % self.tp]
        if odd:
            return f"the {self.layer} layer splits {', '.join(odd)} over tp={self.tp}"
        if self.sequence_parallel and (self.tp == 1 or any(s % self.tp for s in self.tokens)):
            return f"sequence parallelism needs tp > 1 and token counts {self.tokens} that tp={self.tp} divides"
        if self.chunks not in CHUNKS or self.dtype not in DTYPES or self.autocast not in AUTOCAST:
            return f"chunks, dtype and autocast must be among {CHUNKS}, {DTYPES} and {AUTOCAST}"
        if self.main_grad and (self.tp == 1 or self.chunks == 1):
            return ("gradient-accumulation fusion is drawn with tp > 1 and chunks > 1 only: otherwise CoC has "
                    "nothing to overlap, and megatron's own fused weight-gradient path needs its CUDA extension")
        if self.uneven() and len(self.tokens) > 1:
            return ("uneven micro-batches are drawn one at a time: a refusal of a later one comes after the "
                    "earlier ones' collectives")
        if self.autocast and (self.dtype != "float32" or (self.layer, self.sequence_parallel) not in AUTOCAST_LAYERS):
            return (f"autocast runs float32 layers among {AUTOCAST_LAYERS} only (megatron's own serial path "
                    "cannot run the others under CPU autocast)")
        return ""

    def job(self) -> LayerJob:
        """The suite's job for this spec (what ``layer_task`` runs on every rank)."""
        require_runnable(self)
        problem = LayerProblem(self.layer, self.sequence_parallel, self.h_in, self.h_out, self.dtype, b=self.b,
                               tokens=self.tokens, ffn=self.ffn or None, bias=self.bias, seed=self.seed)
        return LayerJob(problem, self.tp, tuple(coc_argv(self.chunks)), steps=self.steps, main_grad=self.main_grad,
                        straggler_s=self.straggler_s, autocast=self.autocast)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND_NAME, **asdict(self)}

    def describe(self) -> str:
        sizes = f"{self.h_in}->{self.ffn}->{self.h_out}" if self.ffn else f"{self.h_in}->{self.h_out}"
        modes = [f"world {self.world}" if self.replicas > 1 else "", "" if self.bias else "no bias",
                 f"{self.steps} steps" if self.steps > 1 else "", "main_grad" if self.main_grad else "",
                 f"autocast {self.autocast}" if self.autocast else "",
                 f"stragglers {self.straggler_s}s" if self.straggler_s else ""]
        return (f"{self.layer} {'sp' if self.sequence_parallel else 'nosp'} tp{self.tp} {sizes} {self.dtype} "
                f"b{self.b} tokens {list(self.tokens)} p{self.chunks}" + "".join(f", {m}" for m in modes if m))


def _smaller_tokens(tokens: tuple[int, ...]) -> list[tuple[int, ...]]:
    """A micro-batch fewer, or one micro-batch's tokens smaller."""
    fewer = [tokens[:i] + tokens[i + 1:] for i in range(len(tokens))] if len(tokens) > 1 else []
    return fewer + [tokens[:i] + (v,) + tokens[i + 1:] for i, s in enumerate(tokens) for v in smaller_ints(s)]


#: A micro-batch's token count, and how many micro-batches a case has (each its own report bucket).
TOKENS = size(24, 96, 384)
MICRO_BATCHES = weighted((1, 2, 3), (4, 3, 1))


def _draw_tokens(rng: random.Random) -> tuple[int, ...]:
    return tuple(TOKENS(rng) for _ in range(MICRO_BATCHES(rng)))


#: Fields of the spec, simplest first where the shrinker reads them.
DIMENSIONS = Space(
    Dimension("layer", weighted(LAYER_KINDS, (1, 1, 1)), towards(*LAYER_KINDS)),
    Dimension("sequence_parallel", weighted((False, True), (1, 1)), towards(False, True)),
    Dimension("tp", weighted((1, 2, 3, 4), (1, 4, 2, 3)), lambda tp: [t for t in (1, 2, 3, 4) if t < tp]),
    Dimension("replicas", weighted((1, 2), (4, 1)), lambda r: [1] if r > 1 else []),
    Dimension("steps", weighted((1, 2, 3), (4, 2, 1)), lambda s: list(range(1, s))),
    Dimension("tokens", _draw_tokens, _smaller_tokens, lambda t: TOKENS.bucket(max(t)), TOKENS.buckets),
    Dimension("b", weighted((1, 2, 3), (3, 2, 1)), lambda b: list(range(1, b))),
    Dimension("h_in", size(48, 160, 512), smaller_ints),
    Dimension("h_out", size(48, 160, 512), smaller_ints),
    Dimension("ffn", size(64, 192, 512, (60, 25, 15)), smaller_ints, absent=0),  # the MLP's (a third of draws)
    Dimension("dtype", weighted(DTYPES, (1,) * len(DTYPES)), towards(*DTYPES)),
    Dimension("bias", weighted((False, True), (1, 3)), towards(True, False)),
    Dimension("chunks", weighted(CHUNKS, (1, 3, 2, 1)), towards(*CHUNKS)),
    Dimension("main_grad", weighted((False, True), (3, 1)), towards(False, True)),
    Dimension("autocast", weighted(AUTOCAST, (3, 2)), towards(*AUTOCAST)),
    Dimension("straggler_s", weighted((0.0, 0.002), (6, 1)), lambda s: [0.0] if s else []),
)


def fit(spec: LayerSpec, up: bool) -> LayerSpec:
    """``spec`` made runnable: split sizes (and SP token counts) rounded to multiples of ``tp`` (up or down), the
    MLP's width only for the MLP, SP only with tp > 1, autocast only where it runs."""
    def rounded(value: int) -> int:
        return space.round_to(value, spec.tp, up)

    sp = spec.sequence_parallel and spec.tp > 1
    fitted = replace(spec, sequence_parallel=sp, ffn=(spec.ffn or 1) if spec.layer == "mlp" else 0,
                     tokens=tuple(map(rounded, spec.tokens)) if sp else spec.tokens)
    sizes: dict[str, Any] = {name: rounded(getattr(fitted, name)) for name in fitted.split_sizes()}
    fitted = replace(fitted, **sizes)
    if fitted.autocast and fitted.invalid():
        fitted = replace(fitted, autocast=None)
    if fitted.main_grad and (fitted.tp == 1 or fitted.chunks == 1):
        fitted = replace(fitted, main_grad=False)
    if fitted.uneven() and len(fitted.tokens) > 1:
        fitted = replace(fitted, tokens=fitted.tokens[:1])
    return fitted


def offered(scope: Scope) -> str:
    return scope.layers


def draw(rng: random.Random, scope: Scope | None = None) -> LayerSpec:
    """One case from the space, valid by construction."""
    values = DIMENSIONS.draw(rng)
    while values["tp"] * values["replicas"] > MAX_WORLD:
        values["replicas"] = 1
    return fit(LayerSpec(**values, seed=rng.randrange(1 << 16)), up=True)


def neighbours(spec: LayerSpec) -> Iterator[LayerSpec]:
    """Every valid one-step-simpler spec, simplest first."""
    return space.valid_neighbours(spec, _steps(spec), lambda c: fit(c, up=False))


def _steps(spec: LayerSpec) -> Iterable[LayerSpec]:
    yield from DIMENSIONS.simpler(spec)
    if spec.h_in == spec.h_out:  # a square layer's sizes shrink together
        for value in smaller_ints(spec.h_in):
            yield replace(spec, h_in=value, h_out=value)


def tags(spec: LayerSpec) -> list[str]:
    return DIMENSIONS.tags(spec) + [f"micro_batches={len(spec.tokens)}", f"uneven={spec.uneven()}"]


def buckets() -> dict[str, tuple[str, ...]]:
    """Every ``dimension=bucket`` :func:`tags` names, each one a draw reaches."""
    return {**DIMENSIONS.buckets(), "micro_batches": MICRO_BATCHES.buckets, "uneven": ("False", "True")}


def modes(spec: LayerSpec) -> frozenset[str]:
    """What of the implementation ``spec`` needs: its layer, and each mode an implementation may lack."""
    optional = ["sequence parallel" if spec.sequence_parallel else "", "main_grad" if spec.main_grad else "",
                f"autocast {spec.autocast}" if spec.autocast else ""]
    return frozenset({spec.capability} | {m for m in optional if m})


def judge_spec(ranks: Ranks, spec: LayerSpec, scope: Scope, verdicts: Verdicts) -> Judged:
    """Run ``spec`` on ``ranks`` and record the suite's checks of a training job into ``verdicts``: by the one rule
    of what raised (``sort_layer_attempts``: where rows do not divide into the chunks a clear refusal is
    conforming), every output and gradient that came back judged."""
    job = spec.job()
    outcomes = run_to_the_end(ranks, spec, verdicts, layer_task, job=job)
    if isinstance(outcomes, Judged):
        return outcomes
    try:
        attempts = sort_layer_attempts(verdicts, outcomes, what=spec.describe(), refusal_allowed=spec.uneven())
    except NotOffered as why:
        return Judged(skipped=str(why), not_offered=modes(spec))
    if attempts.raised and spec.uneven():
        m, rows = max(spec.tokens) * spec.b, min(spec.rows())
        judge_layer_refusal(verdicts, outcomes, scope.declarations, label="token counts", what=spec.describe(),
                            names=layer_refusal_names(m, rows, spec.chunks, spec.tp))
    if attempts.returned:
        judge_training(verdicts, job, outcomes, chunks=spec.chunks)
    return Judged.of(verdicts)


def from_dict(data: dict[str, Any]) -> LayerSpec:
    """The spec of :meth:`LayerSpec.as_dict`."""
    return read_spec(LayerSpec, data, lambda f: {**f, "tokens": tuple(f["tokens"])})  # type: ignore[return-value]


KIND = Kind(KIND_NAME, weight=1.0, offered=offered, draw=draw, neighbours=neighbours, tags=tags, judge=judge_spec,
            from_dict=from_dict, spec_type=LayerSpec, buckets=buckets, modes=modes,
            subject=lambda spec: spec.layer + (" SP" if spec.sequence_parallel else ""))
