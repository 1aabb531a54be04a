"""A layer case on its rank's device: the megatron module(s), the micro-batches, the ``main_grad``, autocast.

All drawn on the CPU from the problem's seed and then moved, so every device
judges the same numbers (``docs/DESIGN.md#layouts``); the module marks where
each layer's forward and backward start in the collective timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

from conformance.cases.memory import to_device
from conformance.contract.jobs import LayerJob
from conformance.contract.layouts import layout, shard
from conformance.contract.problems import LayerProblem, layer_batch, main_grad_prefill
from conformance.harness.probes import CollectiveLog


class Mlp:
    """Column (fc1) -> exact gelu -> row (fc2), marking each layer's phases in the timeline."""

    def __init__(self, fc1: Any, fc2: Any) -> None:
        self.fc1, self.fc2 = fc1, fc2

    def __call__(self, x: Any, log: CollectiveLog | None, tag: str) -> Any:
        import torch

        mark_phase(log, "column/forward", tag)
        h, _ = self.fc1(x)
        if log is not None and h.requires_grad:
            h.register_hook(lambda grad: mark_phase(log, "column/backward", tag))
        mark_phase(log, "row/forward", tag)
        y, _ = self.fc2(torch.nn.functional.gelu(h))  # exact (erf) gelu, as the golden
        return y


def mark_phase(log: CollectiveLog | None, phase: str, tag: str) -> None:
    """Mark where ``phase`` (``"<layer kind>/<forward|backward>"``) of micro-batch ``tag`` starts."""
    if log is not None:
        log.mark(f"{phase}@{tag}")


def rank_layers(problem: LayerProblem, weights: Mapping[str, Any], device: str) -> tuple[Any, dict[str, Any]]:
    """The megatron module(s) of ``problem`` on ``device``, loaded with the global ``weights``; params by
    golden name.  Inside ``model_parallel`` (megatron's TP group)."""
    import torch

    from coc_shared.megatron import build_column, build_row

    dtype = getattr(torch, problem.dtype)
    sp, bias = problem.sequence_parallel, problem.bias
    if problem.layer == "mlp":
        assert problem.ffn is not None
        fc1 = build_column(problem.h_in, problem.ffn, bias=bias, sequence_parallel=sp, dtype=dtype,
                           weight=weights["w1"], bias_value=weights["b1"], device=device)
        fc2 = build_row(problem.ffn, problem.h_out, bias=bias, sequence_parallel=sp, dtype=dtype,
                        weight=weights["w2"], bias_value=weights["b2"], device=device)
        return Mlp(fc1, fc2), {"w1": fc1.weight, "b1": fc1.bias, "w2": fc2.weight, "b2": fc2.bias}
    build = build_column if problem.layer == "column" else build_row
    module = build(problem.h_in, problem.h_out, bias=bias, sequence_parallel=sp, dtype=dtype,
                   weight=weights["w"], bias_value=weights["b"], device=device)
    return module, {"w": module.weight, "b": module.bias}


def rank_batches(problem: LayerProblem, steps: int, replica: int, tp_rank: int, tp: int,
                 device: str) -> list[list[dict[str, Any]]]:
    """This rank's ``x`` and ``dy`` of every micro-batch of every step, on ``device`` (drawn on the CPU from
    the problem's seed, moved whole, then sharded: the same numbers and layout on every device)."""
    splits = layout(problem.layer, problem.sequence_parallel)
    micros = 1 if problem.case_id is not None else len(problem.tokens)
    return [[{n: shard(t, splits[n], tp_rank, tp) for n, t in to_device(layer_batch(problem, i, step, replica),
                                                                           device).items()}
             for i in range(micros)] for step in range(steps)]


def main_grad_shards(problem: LayerProblem, step: int, tp_rank: int, tp: int) -> dict[str, Any]:
    """This rank's shards of the fp32 ``main_grad`` each weight starts step ``step`` with, on the CPU."""
    return shard_weights(problem, main_grad_prefill(problem, step), tp_rank, tp)


def rank_main_grads(prefill: Mapping[str, Any], device: str) -> dict[str, Any]:
    """Fresh copies of the pre-filled ``main_grad`` shards on ``device`` (the layer accumulates into them)."""
    return {name: t.to(device, copy=True) for name, t in prefill.items()}


def call_layer(module: Any, kind: str, x: Any, log: CollectiveLog | None, tag: str) -> Any:
    """The forward of ``module`` (a layer of ``kind``, or an :class:`Mlp`) on micro-batch ``tag``, phases marked."""
    if isinstance(module, Mlp):
        return module(x, log, tag)
    mark_phase(log, f"{kind}/forward", tag)
    y, _ = module(x)
    return y


def shard_weights(problem: LayerProblem, tensors: Mapping[str, Any], rank: int, tp: int) -> dict[str, Any]:
    """This rank's shards of ``tensors`` named as the layer's weights (None kept None)."""
    splits = layout(problem.layer, problem.sequence_parallel)
    return {n: None if t is None else shard(t, splits[n], rank, tp) for n, t in tensors.items()}


def precision(job: LayerJob, device: Any) -> Any:
    """``torch.autocast`` to ``job.autocast`` on ``device``'s type, or nothing.

    The backward runs under it too: megatron's ``custom_bwd`` re-enters
    autocast for CUDA only, so on other devices its backward would multiply a
    reduced-precision gradient by a float32 weight.
    """
    import torch

    if job.autocast is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, job.autocast))
