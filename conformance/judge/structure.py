"""STRUCTURE: whether each phase's collective overlaps a matmul the way the implementation declares.

Judged on the timeline the probes record (``docs/DESIGN.md#overlap-structure``):
a collective *overlaps* a matmul when the matmul ran after the collective was
launched and before it was waited for.

* :class:`~conformance.protocol.Chunked`: the phase issues ``chunks``
  collectives of its kind, each asynchronously;
* :class:`~conformance.protocol.OverlapsMatmul`: one of its collectives is in
  flight while the named matmul runs -- identified by what it multiplies, not
  by its shape (shapes coincide: at TP 2 a rank's output block can have the
  weight's shape): in the forward the output is the product that reads the
  layer part's weight; in the backward the input gradient reads it and the
  weight gradient, of the weight's shape, does not;
* :class:`~conformance.protocol.NotOverlapped`: nothing is required, and
  nothing is judged (a check whose every phase is declared so is *not
  judged*, never passed);
* undeclared: some collective of the phase's kind overlaps *some* matmul, or
  a fused vendor op (one that multiplies and communicates) ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.contract.problems import LayerProblem
from conformance.contract.results import LayerOutcome, ObservedCollectives, ObservedMatmul
from conformance.protocol import (
    PHASE_COLLECTIVES,
    Chunked,
    NotOverlapped,
    OverlapsMatmul,
    OverlapStrategy,
    overlap_key,
)
from conformance.record.failures import StructureMismatch
from conformance.record.verdicts import NotJudged

Shape = tuple[int, ...]


@dataclass(frozen=True)
class PartMatmuls:
    """What identifies the matmuls of one layer part on this rank: its weight's operand name and shape."""

    weight: str  #: the name the weight carries in the timeline (``w``, ``w1``, ``w2``)
    weight_shape: Shape  #: this rank's shard of it, ``[out, in]``

    def named(self, matmul: ObservedMatmul, phase: str) -> str | None:
        """Which of :data:`~conformance.protocol.MATMULS` ``matmul`` is in ``phase``, or None (another product)."""
        reads_weight = self.weight in matmul.operands
        if phase == "forward":
            return "output" if reads_weight else None
        if reads_weight:
            return "input_grad"
        shape = tuple(matmul.shape or ())[-2:]
        return "weight_grad" if shape in (self.weight_shape, self.weight_shape[::-1]) else None

    def describe(self, name: str) -> str:
        return {"output": f"the forward product that reads the weight {self.weight}",
                "input_grad": f"the backward product that reads the weight {self.weight}",
                "weight_grad": f"the backward product of shape {list(self.weight_shape)} that does not read "
                               f"{self.weight}"}[name]


def check_phase(timeline: ObservedCollectives | None, key: str, declared: OverlapStrategy | None, *, chunks: int,
                matmuls: PartMatmuls) -> bool:
    """Raise :class:`StructureMismatch` when phase ``key`` is not overlapped as declared.

    ``chunks`` is the configured chunk count; ``matmuls`` identifies the
    layer part's matmuls.  Returns whether anything was judged (False for a
    phase declared ``none``).
    """
    if isinstance(declared, NotOverlapped):
        return False
    kind = PHASE_COLLECTIVES[key]
    if timeline is None:
        raise StructureMismatch(f"{key}: the phase was not observed (no timeline recorded)")
    require_complete(timeline, key)
    calls = timeline.of_kind(kind)
    seen = f"observed {timeline.describe()}"
    if isinstance(declared, Chunked):
        if len(calls) != chunks:
            raise StructureMismatch(f"{key}: declared chunked, expected {chunks} {kind} collective(s) for "
                                    f"{chunks} chunk(s), the patched layer issued {len(calls)}; {seen}")
        if chunks > 1 and not all(c.overlappable for c in calls):
            raise StructureMismatch(f"{key}: declared chunked, but {kind} chunk(s) were issued synchronously "
                                    f"(nothing can overlap them); {seen}")
        if chunks > 1 and not any(c.overlapped for c in calls):
            raise StructureMismatch(f"{key}: declared chunked, but no matmul ran while a {kind} chunk was in "
                                    f"flight (each was waited for at once); {seen}")
        return True
    if isinstance(declared, OverlapsMatmul):
        phase = key.rsplit("/", 1)[-1]
        wanted = declared.matmul
        if wanted == "output" and phase != "forward" or wanted != "output" and phase == "forward":
            raise StructureMismatch(f"{key}: declared to overlap the {wanted} matmul, which this phase does "
                                    f"not have; {seen}")
        if not any(c.overlappable and any(matmuls.named(m, phase) == wanted for m in c.overlapped) for c in calls):
            raise StructureMismatch(f"{key}: declared one {kind} in flight while the {wanted} matmul "
                                    f"({matmuls.describe(wanted)}) runs; no such matmul ran while "
                                    f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} was in flight; {seen}")
        return True
    if not timeline.fused_ops and not any(c.overlapped for c in calls):
        raise StructureMismatch(f"{key}: no {kind} collective overlaps a matmul (none was in flight while a "
                                f"matmul ran, and no fused op ran): the phase is serial; {seen}")
    return True


def require_complete(timeline: ObservedCollectives, what: str) -> None:
    """Raise :class:`NotJudged` where work ran on a thread the probes cannot follow during ``timeline``: what it did
    is missing from it, so nothing read from the timeline's collectives is judged (never passed)."""
    unseen = (*timeline.other_threads, *timeline.other_thread_matmuls)
    if unseen:
        raise NotJudged(f"{what}: collective(s) or matmul(s) ran on a thread the probes cannot follow "
                        f"({'; '.join(unseen)}): the timeline is incomplete, so it is not judged")


def layer_parts(layer: str) -> list[str]:
    return ["column", "row"] if layer == "mlp" else [layer]


def may_chunk(overlap: Mapping[str, OverlapStrategy], part: str, sp: bool) -> bool:
    """Whether a phase of layer part ``part`` is declared chunked (or undeclared) in ``overlap``: only those have a
    chunk count to change or to fall back from."""
    keys = [key for key in PHASE_COLLECTIVES if key.startswith(f"{part}/{'sp' if sp else 'nosp'}/")]
    return any(not isinstance(overlap.get(key, Chunked()), (OverlapsMatmul, NotOverlapped)) for key in keys)


def part_matmuls(problem: LayerProblem, kind: str, tp: int) -> PartMatmuls:
    """The matmuls of layer part ``kind`` on a rank: its weight's name in the timeline and shard shape."""
    if problem.layer == "mlp":
        assert problem.ffn is not None
        out, inp = (problem.ffn, problem.h_in) if kind == "column" else (problem.h_out, problem.ffn)
        weight = "w1" if kind == "column" else "w2"
    else:
        out, inp = problem.h_out, problem.h_in
        weight = "w"
    return PartMatmuls(weight, (out // tp, inp) if kind == "column" else (out, inp // tp))


def check_layer_structure(problem: LayerProblem, outcomes: Sequence[LayerOutcome], overlap: Mapping[str, Any], *,
                    chunks: int | Mapping[str, int], tp: int, fused: bool = False) -> None:
    """STRUCTURE on every rank: each phase of each layer part overlaps as declared, judged phase by phase.

    ``chunks`` is the configured count, or one per phase key.  Fused layers
    tile by their own plan, so a phase declared chunked is only required to
    overlap some matmul there.  A phase with work the probes could not follow
    is not judged, and the others still are: any phase that fails fails the
    check (naming the phases not judged beside it); else a phase not judged
    makes the check not judged (:class:`~conformance.record.verdicts.NotJudged`,
    never passed), as does every phase declared ``none``.
    """
    judged, failed, unjudged = False, [], []
    for rank, outcome in enumerate(outcomes):
        for kind in layer_parts(problem.layer):
            for phase in ("forward", "backward"):
                key = overlap_key(kind, problem.sequence_parallel, phase)
                if key not in PHASE_COLLECTIVES:
                    continue
                declared = overlap.get(key)
                if fused and isinstance(declared, Chunked):
                    declared = None
                count = chunks if isinstance(chunks, int) else chunks.get(key, 1)
                try:
                    judged |= check_phase(outcome.timelines.get(f"{kind}/{phase}"), key, declared, chunks=count,
                                          matmuls=part_matmuls(problem, kind, tp))
                except StructureMismatch as failure:
                    failed.append(f"rank {rank}: {failure}")
                except NotJudged as why:
                    unjudged.append(f"rank {rank}: {why}")
    aside = f"\n(not judged: {'; '.join(unjudged)})" if unjudged else ""
    if failed:
        raise StructureMismatch("\n".join(failed) + aside)
    if unjudged:
        raise NotJudged("; ".join(unjudged) + ("; every other phase overlapped as declared" if judged else ""))
    if not judged:
        raise NotJudged(f"every phase of the {problem.layer} layer is declared 'none' (not overlapped): "
                        "no overlap to judge")
