"""Judging layer outcomes: pieces of every rank assembled per replica, against float64 truth.

The truth (``conformance/judge/layer_truth.py``) is the training replayed in
float64, or a golden case's stored outputs.  Every output and gradient of every step and
micro-batch is compared under the error bound (``docs/DESIGN.md#error-bound``),
with the live unpatched layers as the serial reference; a failure names the
tensor, step, micro-batch, replica, rows and ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.contract.layouts import Split, layout
from conformance.contract.problems import LayerProblem
from conformance.contract.rank_errors import CapturedError
from conformance.contract.results import LayerOutcome
from conformance.judge import assembly, checks, numerics
from conformance.judge.assembly import assemble, by_replica, copies
from conformance.judge.group_notes import group_note
from conformance.judge.layer_truth import truth
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import ContractViolation, NumericMismatch, WrongError, suite_requires
from conformance.record.levels import Level
from conformance.record.verdicts import NotJudged

if TYPE_CHECKING:
    import torch


def roundings(tp: int, chunks: int, layer: str, micro_batches: int = 1) -> int:
    """R of the bound: TP partials summed, chunked weight-grad sums, bias and cast, per linear layer."""
    return (numerics.tp_sum_roundings(tp) + chunks + 2 + 2 * (micro_batches - 1)) * (2 if layer == "mlp" else 1)


def attempts_of(outcomes: Sequence[LayerOutcome]) -> dict[str, list[CapturedError | None]]:
    """Every attempt of a layer case (configure, each forward and backward, in order) -> what it raised on each
    rank (None: it came back, or that rank did not get to make it)."""
    labels = list(dict.fromkeys(label for o in outcomes for label in o.attempts))
    return {label: [o.errors.get(label) for o in outcomes] for label in labels}


def check_ran(outcomes: Sequence[LayerOutcome], what: str, raised: Sequence[str]) -> None:
    """MUST: the patched layers ran on every rank: the attempts ``raised`` (by label) raised where they must run."""
    for label in raised:
        errors = [o.errors.get(label) for o in outcomes]
        ranks = [r for r, e in enumerate(errors) if e is not None]
        first = next(e for e in errors if e is not None)
        raise WrongError(f"{what}, {label}: rank(s) {ranks} raised {first.describe()} where the patched layers "
                         f"must run\n{first.traceback}")


def check_training(problem: LayerProblem, outcomes: Sequence[LayerOutcome], *, tp: int, chunks: int,
                   evidence: CaseEvidence, fusion: bool = False, run: int = 0, autocast: str | None = None) -> None:
    """Every output and gradient of every step, micro-batch and replica within the bound (each comparison kept in
    the case's ``evidence``).

    Under ``autocast`` the products are rounded to that dtype, so the bound is
    that dtype's (the truth stays float64).  A mismatch says so when the
    patched layers issued collectives outside their TP group.
    """
    try:
        _check_training(problem, outcomes, tp=tp, chunks=chunks, fusion=fusion, run=run, autocast=autocast,
                        evidence=evidence)
    except NumericMismatch as failure:
        raise NumericMismatch(f"{failure}{foreign_groups(outcomes)}") from None


def foreign_groups(outcomes: Sequence[LayerOutcome]) -> str:
    """``"; ... collectives ran on ..."`` when some ran on a group other than the rank's TP group, or a gone one."""
    return "".join(dict.fromkeys(
        group_note([c for t in o.timelines.values() for c in t.collectives], o.members, "the patched layers")
        for o in outcomes))


def _check_training(problem: LayerProblem, outcomes: Sequence[LayerOutcome], *, tp: int, chunks: int,
                    fusion: bool, run: int, autocast: str | None, evidence: CaseEvidence) -> None:
    import torch

    splits = layout(problem.layer, problem.sequence_parallel)
    dtype = getattr(torch, autocast or problem.dtype)
    micro_count = 1 if problem.case_id is not None else len(problem.tokens)
    r = roundings(tp, chunks, problem.layer, micro_count)
    # Fused into fp32 main_grad, a weight gradient is as exact as fp32 only when its GEMM's inputs are the layer's
    # own inputs (x, dy); in the MLP they are activations rounded to the layer's dtype, under autocast too.
    exact_wgrad_inputs = problem.layer != "mlp" and autocast is None
    compared = 0
    for replica, ranks in by_replica(outcomes).items():
        if any(len(o.coc) <= run for o in ranks):
            continue  # patch_megatron raised: nothing of this run came back
        steps = len(ranks[0].coc[run])
        suite_requires(steps > 0, f"replica {replica}: the patched layers' run {run} recorded no training step")
        for step in range(steps):
            expected = truth(problem, step, replica, fusion)
            where = f"step {step}, replica {replica}" if (steps > 1 or len(by_replica(outcomes)) > 1) else ""
            for micro in range(micro_count):
                for name in ("y", "dx"):
                    pieces = [o.coc[run][step].outputs[micro].get(name) for o in ranks]
                    if any(p is None for p in pieces):
                        continue  # its forward or backward raised on some rank: nothing came back to compare
                    _compare(name, pieces, [o.serial[step].outputs[micro][name] for o in ranks if o.serial] or None,
                             expected.micro[micro][name], expected.envelopes[micro][name], splits[name],
                             dtype, r, tp, _label(where, micro, micro_count), evidence)
                    compared += 1
            if not all(o.coc[run][step].grads for o in ranks):
                continue  # a forward or backward of the step raised: its gradients are partial
            for name, value in expected.grads.items():
                got = [o.coc[run][step].grads.get(name) for o in ranks]
                if any(g is None for g in got):
                    raise NumericMismatch(f"{name} ({where or 'step 0'}): the patched layers left no gradient")
                grad_dtype = torch.float32 if fusion and name.startswith("dw") and exact_wgrad_inputs else dtype
                _compare(name, got, [o.serial[step].grads[name] for o in ranks if o.serial] or None, value,
                         expected.grad_envelopes[name], splits[name], grad_dtype, r, tp, where, evidence)
                compared += 1
    if not compared:
        raise NotJudged("no output or gradient of the patched layers came back on every rank: nothing to compare")


def _label(where: str, micro: int, count: int) -> str:
    parts = [where] if where else []
    if count > 1:
        parts.append(f"micro-batch {micro}")
    return ", ".join(parts)


def _compare(name: str, pieces: list[Any], serial_pieces: list[Any] | None, truth: np.ndarray,
             envelope: tuple[np.ndarray, int], split: Split, dtype: Any, roundings: int, tp: int,
             where: str, evidence: CaseEvidence) -> None:
    try:
        held = copies(pieces, split)
    except ContractViolation as failure:
        raise ContractViolation(f"{f'{name} ({where})' if where else name}: {failure}") from None
    for holders, out in held:
        label = ", ".join(filter(None, (f"{name} ({where})" if where else name, holders)))
        if out.numel() != np.size(truth):
            raise NumericMismatch(f"{label}: the result has shape {list(out.shape)} ({out.numel()} elements), the "
                                  f"expected one {list(np.shape(truth))} ({np.size(truth)})")
        serial = assemble(serial_pieces, split) if serial_pieces else out
        expected = np.asarray(truth).reshape(tuple(out.shape))
        magnitude = np.asarray(envelope[0]).reshape(tuple(out.shape))
        checks.check_close(label, out, expected, serial, (magnitude, envelope[1]), dtype, roundings=roundings,
                           evidence=evidence, split=split, tp=tp)


def replicated(problem: LayerProblem, tp: int) -> bool:
    """Whether the layer has a result the ranks of a TP group of ``tp`` hold whole: an output (``y``) or a gradient
    (``dx``, ``dw*``, ``db*``) not split over them (with SP none is)."""
    splits = layout(problem.layer, problem.sequence_parallel)
    return tp > 1 and any(split is Split.FULL for name, split in splits.items()
                          if name == "y" or (name.startswith("d") and name != "dy"))


def check_identical_copies(problem: LayerProblem, outcomes: Sequence[LayerOutcome], run: int = 0, *,
                           chunks: int = 1, fusion: bool = False) -> None:
    """SHOULD: every replicated output and gradient is bitwise the same on every rank of a replica.

    ``chunks`` and ``fusion`` are the run's: a mismatch's message judges each copy by the error bound.  Not
    judged when no tensor was held by two ranks (nothing to compare).
    """
    compared = 0
    splits = layout(problem.layer, problem.sequence_parallel)
    micro_count = 1 if problem.case_id is not None else len(problem.tokens)
    bound = _CopyBound(problem, roundings(len(outcomes[0].members) or 1, chunks, problem.layer, micro_count), fusion)
    for replica, ranks in by_replica(outcomes).items():
        if any(len(o.coc) <= run for o in ranks):
            continue  # patch_megatron raised: nothing of this run came back
        for step, runs in enumerate(zip(*(o.coc[run] for o in ranks))):
            where = f"step {step}, replica {replica}"
            serial = ranks[0].serial[step] if ranks[0].serial else None
            for micro in range(len(runs[0].outputs)):
                for name in ("y", "dx"):
                    pieces = [r.outputs[micro].get(name) for r in runs]
                    if any(p is None for p in pieces):
                        continue  # it raised on some rank: nothing came back to compare
                    compared += assembly.check_identical_copies(
                        pieces, splits[name], f"{name} ({where}, micro-batch {micro})",
                        bound.ratio(step, replica, name, micro, serial.outputs[micro][name] if serial else None))
            for name in runs[0].grads:
                pieces = [r.grads.get(name) for r in runs]
                if all(p is not None for p in pieces):
                    compared += assembly.check_identical_copies(pieces, splits[name], f"{name} ({where})", bound.ratio(
                        step, replica, name, None, serial.grads.get(name) if serial else None))
    if not compared:
        raise NotJudged(f"no output or gradient of the {problem.layer} layer was held whole by two ranks "
                        f"(TP {len(outcomes[0].members) or 1}): no copies to compare")


@dataclass(frozen=True)
class _CopyBound:
    """Judges one copy of a replicated output or gradient by the error bound (only when asked: on a mismatch)."""

    problem: LayerProblem
    roundings: int
    fusion: bool

    def ratio(self, step: int, replica: int, name: str, micro: int | None, serial: Any) -> assembly.WorstRatio:
        import torch

        def worst(copy: torch.Tensor) -> float:
            expected = truth(self.problem, step, replica, self.fusion)
            value, envelope = ((expected.micro[micro][name], expected.envelopes[micro][name]) if micro is not None
                               else (expected.grads[name], expected.grad_envelopes[name]))
            shape = tuple(copy.shape)
            value = np.asarray(value).reshape(shape)
            dtype = torch.float32 if self.fusion and name.startswith("dw") else getattr(torch, self.problem.dtype)
            return numerics.compare(name, copy, value, value if serial is None else serial,
                                    magnitude=np.asarray(envelope[0]).reshape(shape), reduction_len=envelope[1],
                                    roundings=self.roundings, dtype=dtype).stats.worst_ratio

        return worst


def check_saved_gather(outcomes: Sequence[LayerOutcome]) -> None:
    """SHOULD, ``recompute_all_gather=False``: the column backward does not all-gather its input again.  A
    re-gather seen on any rank fails; none seen where some rank's backward did work the probes could not follow is
    not judged (the re-gather may be there), never passed."""
    from conformance.judge.structure import require_complete

    timelines = [(rank, o.timelines.get("column/backward")) for rank, o in enumerate(outcomes)]
    if not any(timeline is not None for _, timeline in timelines):
        raise NotJudged("no rank recorded the column backward: no all-gather to look for")
    for rank, timeline in timelines:
        gathers = timeline.of_kind("all_gather") if timeline is not None else []
        if gathers:
            raise WrongError(f"rank {rank}: recompute_all_gather=False, yet the column backward all-gathered "
                             f"its input again ({len(gathers)} all-gather(s))", level=Level.SHOULD)
    for rank, timeline in timelines:
        if timeline is not None:
            require_complete(timeline, f"rank {rank}: the column backward")


def check_values(outcomes: Sequence[LayerOutcome]) -> None:
    """MUST: kept outputs did not change, inputs were not mutated, outputs share no memory."""
    for rank, outcome in enumerate(outcomes):
        if outcome.changed_after_return:
            raise ContractViolation(f"rank {rank}: outputs changed after they were returned (results kept "
                                    f"across calls must be values): {outcome.changed_after_return}")
        if outcome.mutated:
            raise ContractViolation(f"rank {rank}: the patched layers changed their inputs: {outcome.mutated}")
        if outcome.shared_memory:
            raise ContractViolation(f"rank {rank}: outputs of different calls share memory: "
                                    f"{outcome.shared_memory}")


def check_main_grad(outcomes: Sequence[LayerOutcome]) -> None:
    """Under fusion the weight's ``.grad`` holds no second copy of the gradient (no double counting)."""
    _needs_weight_grads(outcomes)
    for rank, outcome in enumerate(outcomes):
        for step, run in enumerate(outcome.coc[0] if outcome.coc else ()):
            doubled = {name: state for name, state in run.weight_grad.items() if state == "values"}
            if doubled:
                raise NumericMismatch(
                    f"rank {rank} step {step}: with gradient-accumulation fusion the weight gradient went into "
                    f"main_grad *and* .grad ({sorted(doubled)}), without grad_added_to_main_grad set: Megatron's "
                    "DDP would add it twice")


def _needs_weight_grads(outcomes: Sequence[LayerOutcome]) -> None:
    """Not judged when no rank recorded where a weight gradient went: nothing to compare."""
    if not any(run.weight_grad for outcome in outcomes for run in (outcome.coc[0] if outcome.coc else ())):
        raise NotJudged("no rank recorded where a weight gradient went (main_grad, .grad): nothing to judge")


def check_fusion_honoured(outcomes: Sequence[LayerOutcome]) -> None:
    """SHOULD: under fusion the weight gradient is accumulated into ``main_grad``, not returned as a full ``.grad``."""
    _needs_weight_grads(outcomes)
    for rank, outcome in enumerate(outcomes):
        for step, run in enumerate(outcome.coc[0] if outcome.coc else ()):
            unfused = sorted(name for name, state in run.weight_grad.items() if state == "grad only")
            if unfused:
                raise WrongError(
                    f"rank {rank} step {step}: gradient-accumulation fusion not honoured: the weight gradient "
                    f"came back as a full .grad ({unfused}) and main_grad was left alone (Megatron's DDP adds it, "
                    "so training is right, but the fusion's memory and time saving is lost)", level=Level.SHOULD)
