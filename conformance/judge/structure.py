"""STRUCTURE: whether each phase's collective overlaps a matmul the way the implementation declares.

Judged on the timeline the probes record (``docs/DESIGN.md#overlap-structure``):
a collective *overlaps* a matmul when the matmul ran after the collective was
launched and before it was waited for.

* :class:`~conformance.protocol.Chunked`: the phase issues ``chunks``
  collectives of its kind, each asynchronously;
* :class:`~conformance.protocol.OverlapsMatmul`: one of its collectives is in
  flight while the named matmul (identified by its output shape) runs;
* :class:`~conformance.protocol.NotOverlapped`: nothing is required, and
  nothing is judged (a check whose every phase is declared so is *not
  judged*, never passed);
* undeclared: some collective of the phase's kind overlaps *some* matmul, or
  a fused vendor op (one that multiplies and communicates) ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conformance.contract.problems import LayerProblem
from conformance.contract.results import LayerOutcome, ObservedCollectives
from conformance.judge.failures import StructureMismatch
from conformance.judge.verdicts import NotJudged
from conformance.protocol import (
    PHASE_COLLECTIVES,
    Chunked,
    NotOverlapped,
    OverlapsMatmul,
    OverlapStrategy,
    overlap_key,
)

Shape = tuple[int, ...]


def matmul_matches(shape: Shape | None, wanted: Shape) -> bool:
    """Whether a matmul output of ``shape`` is the product ``wanted`` (either orientation; last-dim only if 1-D)."""
    if shape is None:
        return False
    if len(wanted) == 1:
        return bool(shape) and shape[-1] == wanted[0]
    return tuple(shape[-2:]) in (tuple(wanted), tuple(reversed(wanted)))


def check_phase(timeline: ObservedCollectives | None, key: str, declared: OverlapStrategy | None, *, chunks: int,
                matmuls: Mapping[str, Shape]) -> bool:
    """Raise :class:`StructureMismatch` when phase ``key`` is not overlapped as declared.

    ``chunks`` is the configured chunk count; ``matmuls`` maps a matmul name
    (:data:`~conformance.protocol.MATMULS`) to its output shape on this rank.
    Returns whether anything was judged (False for a phase declared ``none``).
    """
    if isinstance(declared, NotOverlapped):
        return False
    kind = PHASE_COLLECTIVES[key]
    if timeline is None:
        raise StructureMismatch(f"{key}: the phase was not observed (no timeline recorded)")
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
        wanted = matmuls.get(declared.matmul)
        if wanted is None:
            raise StructureMismatch(f"{key}: declared to overlap the {declared.matmul} matmul, which this "
                                    f"phase does not have; {seen}")
        others = [shape for name, shape in matmuls.items() if name != declared.matmul and len(shape) == 2]

        def is_wanted(shape: Shape | None) -> bool:
            return matmul_matches(shape, wanted) and not any(matmul_matches(shape, o) for o in others)

        if not any(c.overlappable and any(is_wanted(s) for s in c.overlapped) for c in calls):
            raise StructureMismatch(f"{key}: declared one {kind} overlapped with the {declared.matmul} matmul "
                                    f"(output {list(wanted)}); no {kind} was in flight while it ran; {seen}")
        return True
    if not timeline.fused_ops and not any(c.overlapped for c in calls):
        raise StructureMismatch(f"{key}: no {kind} collective overlaps a matmul (none was in flight while a "
                                f"matmul ran, and no fused op ran): the phase is serial; {seen}")
    return True


def layer_parts(layer: str) -> list[str]:
    return ["column", "row"] if layer == "mlp" else [layer]


def _matmuls(problem: LayerProblem, kind: str, tp: int) -> dict[str, tuple[int, ...]]:
    """Output shapes (this rank's) of the matmuls a phase of layer part ``kind`` may overlap."""
    if problem.layer == "mlp":
        assert problem.ffn is not None
        out, inp = (problem.ffn, problem.h_in) if kind == "column" else (problem.h_out, problem.ffn)
    else:
        out, inp = problem.h_out, problem.h_in
    w = (out // tp, inp) if kind == "column" else (out, inp // tp)
    return {"weight_grad": w, "output": (w[0],), "input_grad": (w[1],)}


def check_layer_structure(problem: LayerProblem, outcomes: Sequence[LayerOutcome], overlap: Mapping[str, Any], *,
                    chunks: int | Mapping[str, int], tp: int, fused: bool = False) -> None:
    """STRUCTURE on every rank: each phase of each layer part overlaps as declared.

    ``chunks`` is the configured count, or one per phase key.  Fused layers
    tile by their own plan, so a phase declared chunked is only required to
    overlap some matmul there.  Raises :class:`~conformance.judge.verdicts.NotJudged`
    when every phase is declared ``none``: nothing was judged.
    """
    judged = False
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
                                          matmuls=_matmuls(problem, kind, tp))
                except StructureMismatch as failure:
                    raise StructureMismatch(f"rank {rank}: {failure}") from None
    if not judged:
        raise NotJudged(f"every phase of the {problem.layer} layer is declared 'none' (not overlapped): "
                        "no overlap to judge")
