"""Rank-side tasks of the Megatron layer checks (``docs/DESIGN.md#layouts``).

:func:`layer_task` builds the real megatron.core layers of a
:class:`~conformance.contract.problems.LayerProblem` twice on this rank -- one left
alone (the live serial reference in the same dtype), one run under the
implementation's ``patch_megatron`` (the CoC result) -- and trains both the
same way: per optimizer step, every micro-batch forward back to back (results
kept), then every backward (both under ``torch.autocast`` when the job asks),
then the same in-place weight update.  Under
gradient-accumulation fusion the CoC layer's weights carry a pre-filled fp32
``main_grad`` that its backward must accumulate into, as Megatron's DDP sets
up.  It returns this rank's pieces of every output and gradient, and for the
first micro-batch the collectives of each layer and phase.

Megatron is reached through :mod:`coc_shared.megatron` (placement on the
rank's device, parallel state), never through the implementation under test.
With a world larger than TP, Megatron's own ``initialize_model_parallel`` puts
the other ranks in data-parallel replicas, each with its own data.

Everything the layers receive is on the rank's device (``ctx.device``): the
modules, the micro-batches, the pre-filled ``main_grad``
(:mod:`conformance.cases.rank_layers`) and the weight updates, all drawn on
the CPU from the problem's seed and then moved, so every device judges the
same numbers; results go back to the judge on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from conformance.cases.memory import clone, overlaps, poisoned_allocations
from conformance.cases.rank_layers import (
    Mlp,
    call_layer,
    main_grad_shards,
    mark_phase,
    precision,
    rank_batches,
    rank_layers,
    rank_main_grads,
    shard_weights,
)
from conformance.contract.jobs import LayerJob
from conformance.contract.problems import LayerProblem, layer_deltas, layer_weights
from conformance.contract.results import LayerOutcome, ObservedCollectives, StepRun
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.case import IMPL, REFERENCE, RankContext
from conformance.harness.observed import observed_collectives
from conformance.harness.probes import record_collectives
from conformance.harness.probes.collective_log import CollectiveLog
from conformance.harness.rank_warnings import observed_warnings
from conformance.harness.stragglers import Straggler

#: Layers megatron's own (serial) path runs under CPU autocast: its column SP backward reduce-scatters a
#: reduced-precision dx into a buffer of the input's dtype, which gloo refuses (megatron-core 0.16).
AUTOCAST_LAYERS = (("column", False), ("row", True), ("mlp", False))


def layer_task(ctx: RankContext, *, job: LayerJob) -> LayerOutcome:
    """Serial and CoC training of ``job`` on this rank (module docstring)."""
    import torch

    from coc_shared.megatron import model_parallel

    problem, tp = job.problem, job.tp
    ctx.budget_from(0.0)  # configure and the serial reference: the floor, until the serial time is known
    kwargs: dict[str, Any] = {"tp_size": tp}
    if job.coc_cfgs is not None:
        kwargs["coc_cfgs"] = dict(job.coc_cfgs)
    config, error = call_capturing_errors(ctx.impl.configure, list(job.argv), {}, **kwargs)
    with model_parallel(tp, sequence_parallel=problem.sequence_parallel, device=ctx.device) as par:
        import torch.distributed as dist

        replica = par.data_parallel_rank
        outcome = LayerOutcome(None, [], replica=replica, tp_rank=par.rank,
                               members=tuple(dist.get_process_group_ranks(par.group)))
        if error is not None:  # (configure that returned gave nothing to judge: no attempt)
            outcome.attempts.append("configure")
            outcome.errors["configure"] = error
            return outcome
        batches = rank_batches(problem, job.steps, replica, par.rank, tp, ctx.device)
        kept_batches = clone(batches)
        started = time.perf_counter()
        if job.serial:
            with ctx.timer(REFERENCE):
                outcome.serial = _train(problem, job, par, batches, log=None, fusion=False, backward=ctx.backward)
        serial_s = (time.perf_counter() - started) if job.serial else 0.5
        ctx.budget_from(serial_s, calls=job.runs * 2)
        straggler = _straggler(ctx, job)
        seen: list[str] = []
        for run in range(job.runs):
            prefix = f"run {run}, " if job.runs > 1 else ""

            def patched(log: CollectiveLog, first: bool = run == 0, prefix: str = prefix) -> list[StepRun]:
                with ctx.impl.patch_megatron(config):
                    return _train(problem, job, par, batches, log=log, fusion=job.main_grad, backward=ctx.backward,
                                  straggler=straggler, outcome=outcome if first else None,
                                  attempt=_Attempts(outcome, log, prefix))

            with observed_warnings() as said, record_collectives(straggler) as log, \
                    poisoned_allocations(job.poison, ctx.device), ctx.timer(IMPL):
                steps, error = call_capturing_errors(patched, log)
            seen.extend(said)
            if error is not None:  # patch_megatron itself raised, entering or leaving
                _Attempts(outcome, log, prefix).failed(f"{prefix}patch_megatron", error, 0)
                break
            outcome.coc.append(steps)
            if run == 0:
                outcome.timelines = _phases(log, {label.removeprefix(prefix) for label in outcome.errors})
        outcome.warnings = tuple(seen)
        for step, (before, now) in enumerate(zip(kept_batches, batches)):
            for micro, (was, is_) in enumerate(zip(before, now)):
                for name in was:
                    if not torch.equal(was[name], is_[name]):
                        outcome.mutated.append(f"step {step} micro-batch {micro}: input {name!r}")
    return outcome


def _straggler(ctx: RankContext, job: LayerJob) -> Straggler | None:
    return Straggler.of_rank(ctx.rank, job.straggler_s, job.straggler_rank, f"{job.problem.layer}/{job.tp}",
                             lambda seed: 0.5)


def _phases(log: CollectiveLog, raised: set[str]) -> dict[str, ObservedCollectives]:
    """The timeline of each phase of the first micro-batch of the first step: from its mark to the next (none for a
    forward or backward that raised, ``raised`` naming the attempts: what it left is no phase to judge)."""
    marks = [(i, e.label) for i, e in enumerate(log.events) if e.what == "mark"]
    phases: dict[str, ObservedCollectives] = {}
    for (start, label), end in zip(marks, [i for i, _ in marks[1:]] + [len(log.events)]):
        phase, _, tag = label.partition("@")
        if tag == "0.0" and _attempt_label(0, 0, phase.rsplit("/", 1)[-1]) not in raised:
            phases[phase] = observed_collectives(log, start, end)
    return phases


def _attempt_label(step: int, micro: int, phase: str) -> str:
    """An attempt of the patched layers: ``"step 1, micro-batch 0, forward"`` (``phase``: forward or backward)."""
    return f"step {step}, micro-batch {micro}, {phase}"


class _Attempts:
    """Runs each forward and backward of the patched layers as one attempt of ``outcome`` (``prefix`` names the
    CoC run): what it raised is kept under its label, with the collectives it issued before raising, and the
    training goes on (``conformance/judge/attempts.py``: every result that came back is judged)."""

    def __init__(self, outcome: LayerOutcome, log: CollectiveLog, prefix: str) -> None:
        self.outcome, self.log, self.prefix = outcome, log, prefix

    def __call__(self, label: str, fn: Callable[[], Any]) -> tuple[Any, bool]:
        """``(what fn returned, True)``, or ``(None, False)`` when it raised."""
        label = self.prefix + label
        self.outcome.attempts.append(label)
        issued = len(self.log.calls)
        value, error = call_capturing_errors(fn)
        if error is None:
            return value, True
        self.failed(label, error, issued)
        return None, False

    def failed(self, label: str, error: Any, issued: int) -> None:
        """Attempt ``label`` raised ``error`` after the log's first ``issued`` collectives."""
        if label not in self.outcome.attempts:
            self.outcome.attempts.append(label)
        if not self.outcome.errors:
            self.outcome.collectives_before_error = tuple(c.kind for c in self.log.calls[issued:])
        self.outcome.errors[label] = error


def _train(problem: LayerProblem, job: LayerJob, par: Any, batches: list[list[dict[str, Any]]], *,
           log: CollectiveLog | None, fusion: bool, backward: Callable[[Callable[[], Any]], Any],
           straggler: Straggler | None = None, outcome: LayerOutcome | None = None,
           attempt: _Attempts | None = None) -> list[StepRun]:
    """Every step of ``job`` on fresh layers; CoC when called inside ``patch_megatron``.

    Each backward runs through ``backward`` (:meth:`RankContext.backward
    <conformance.harness.case.RankContext.backward>`): on a CPU rank, on another thread, as an accelerator's
    autograd engine runs it.  With ``attempt`` (the patched layers) each forward and backward is one attempt: one
    that raises leaves its outputs (and its step's gradients) out, and the training goes on.
    """
    def run(label: str, fn: Callable[[], Any]) -> tuple[Any, bool]:
        return attempt(label, fn) if attempt is not None else (fn(), True)

    import torch

    tp, rank = par.size, par.rank
    module, params = rank_layers(problem, layer_weights(problem, 0), str(par.device))
    if log is not None:  # the structure check knows a matmul by the weight it multiplies
        for name, param in params.items():
            if param is not None and name.startswith("w"):
                log.name_operand(name, param)
    if fusion:
        for part in (module.fc1, module.fc2) if isinstance(module, Mlp) else (module,):
            part.gradient_accumulation_fusion = True
    kind = problem.layer
    steps: list[StepRun] = []
    kept: list[tuple[tuple[Any, Any], str]] = []  # earlier steps' outputs: (as returned, as copied then), where
    for step, micro_batches in enumerate(batches):
        prefill = main_grad_shards(problem, step, rank, tp) if fusion else {}
        main_grads = rank_main_grads(prefill, str(par.device))
        for name, param in params.items():
            if param is None:
                continue
            param.grad = None
            if name in main_grads:
                param.main_grad = main_grads[name]
                param.grad_added_to_main_grad = False
        xs, ys, returned, came_back = [], [], [], []
        for i, batch in enumerate(micro_batches):
            if straggler is not None:
                straggler()  # arrive late at the call itself
            x = batch["x"].detach().clone().requires_grad_(True)

            def forward(x: Any = x, tag: str = f"{step}.{i}") -> Any:
                with precision(job, x.device):
                    return call_layer(module, kind, x, log, tag)

            y, ok = run(_attempt_label(step, i, "forward"), forward)
            xs.append(x)
            ys.append(y if ok else None)
            returned.append(y.detach().clone() if ok else None)
        for i, (y, batch) in enumerate(zip(ys, micro_batches)):
            if y is None:
                came_back.append(False)
                continue
            mark_phase(log, "row/backward" if kind in ("row", "mlp") else "column/backward", f"{step}.{i}")

            def backward_of(y: Any = y, dy: Any = batch["dy"]) -> None:
                with precision(job, y.device):
                    backward(partial(y.backward, dy))

            came_back.append(run(_attempt_label(step, i, "backward"), backward_of)[1])
        outputs = [{**({"y": y.detach().cpu()} if y is not None else {}),
                    **({"dx": x.grad.detach().cpu().clone()} if done and x.grad is not None else {})}
                   for x, y, done in zip(xs, ys, came_back)]
        if outcome is not None:
            for i, (x, batch) in enumerate(zip(xs, micro_batches)):
                # The tensor the layer was given (a copy of the batch's), not the batch: a layer that
                # writes into its input changes that one.
                if not torch.equal(x.detach(), batch["x"]):
                    outcome.mutated.append(f"step {step} micro-batch {i}: input 'x' (written by the layer)")
            for i, (y, copy) in enumerate(zip(ys, returned)):
                if y is None or copy is None:
                    continue
                if not torch.equal(y.detach(), copy):
                    outcome.changed_after_return.append(f"step {step} micro-batch {i}: y")
                for j, other in enumerate(ys[:i]):
                    if other is not None and overlaps(y, other):
                        outcome.shared_memory.append(f"step {step}: y of micro-batches {j} and {i}")
                for (earlier, _), label in kept:
                    if overlaps(y, earlier):
                        outcome.shared_memory.append(f"y of step {step} micro-batch {i} and of {label}")
                inputs = {"its input x": xs[i], **{f"parameter {n}": p for n, p in params.items() if p is not None}}
                for what, tensor in inputs.items():
                    if overlaps(y, tensor):
                        outcome.shared_memory.append(f"step {step} micro-batch {i}: y and {what}")
            changed = [label for (earlier, copy), label in kept if not torch.equal(earlier.detach(), copy)]
            outcome.changed_after_return.extend(f"{label}'s y, by step {step}" for label in changed)
            kept.extend(((y, copy), f"step {step} micro-batch {i}") for i, (y, copy) in enumerate(zip(ys, returned))
                        if y is not None)
        grads: dict[str, Any] = {}
        weight_grad: dict[str, str] = {}
        for name, param in params.items():
            if param is None or not all(came_back):  # a forward or backward raised: the step's gradients are partial
                continue
            if name in prefill:
                # What Megatron's DDP backward hook leaves: main_grad, plus a .grad not marked as added
                # (megatron/core/distributed/distributed_data_parallel.py, _make_backward_post_hook).
                unmarked = param.grad is not None and not getattr(param, "grad_added_to_main_grad", False)
                effective = param.main_grad.detach().cpu().clone()
                if unmarked:
                    effective += param.grad.detach().cpu().float()
                grads["d" + name] = effective
                untouched = torch.equal(param.main_grad.detach().cpu(), prefill[name])
                weight_grad["d" + name] = ("None" if param.grad is None else "dummy" if not unmarked
                                           else "grad only" if untouched else "values")
            elif fusion is False and job.main_grad and name.startswith("w"):
                # The serial reference of a fusion case: what main_grad must hold afterwards.
                start = main_grad_shards(problem, step, rank, tp)[name]
                grads["d" + name] = start + param.grad.detach().cpu().float()
            else:
                grads["d" + name] = None if param.grad is None else param.grad.detach().cpu().clone()
        steps.append(StepRun(outputs, grads, weight_grad))
        if step + 1 < len(batches):
            deltas = shard_weights(problem, layer_deltas(problem, step), rank, tp)
            with torch.no_grad():
                for name, param in params.items():
                    if param is not None:
                        param.add_(deltas[name].to(param.device))
    return steps
