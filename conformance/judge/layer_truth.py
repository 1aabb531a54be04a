"""The float64 truth a layer case is judged against: its training replayed from the same recipe, or its golden.

The truth of a generated :class:`~conformance.contract.problems.LayerProblem` is its
training replayed in float64 from the same recipe (weights, deltas, batches,
``main_grad`` prefill), with :mod:`golden.serial`'s formulas; a golden case's
is its stored outputs.  Each comes with its envelopes (``|A| @ |B|`` and the
reduction length), which scale the error bound (``docs/DESIGN.md#error-bound``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.contract.problems import LayerProblem, layer_batch, layer_weights, main_grad_prefill
from conformance.judge import numerics

if TYPE_CHECKING:
    import torch


def golden_problem(case_id: str) -> LayerProblem:
    """The :class:`LayerProblem` of a stored golden layer case (its tensors come from the store)."""
    import golden

    p = next(c for c in golden.catalogue("layer") if c.id == case_id).params
    return LayerProblem(p["layer"], p["sequence_parallel"], p["h_in"], p["h_out"], p["dtype"], b=p["b"],
                        tokens=(p["s"],), ffn=p["ffn"], bias=p["with_bias"], case_id=case_id)


@dataclass(frozen=True)
class Truth:
    """The float64 results of one step of one replica and their envelopes (``(|A|@|B|, K)``)."""

    micro: list[dict[str, np.ndarray]]  #: per micro-batch: y, dx
    grads: dict[str, np.ndarray]  #: dw, db ... summed over micro-batches (+ main_grad prefill)
    envelopes: list[dict[str, tuple[np.ndarray, int]]]  #: per micro-batch: y, dx
    grad_envelopes: dict[str, tuple[np.ndarray, int]]


def _f64(t: Any) -> torch.Tensor:
    import torch

    return torch.from_numpy(numerics.as_float64(t))


def truth(problem: LayerProblem, step: int, replica: int, fusion: bool) -> Truth:
    """Replay step ``step`` of ``problem`` for ``replica`` in float64."""
    from golden import serial

    if problem.case_id is not None and replica == 0 and step == 0:
        import golden

        g = golden.load(problem.case_id)
        envelope = _envelope(problem, {n: g.inputs[n] for n in g.inputs})
        outputs = dict(g.outputs)
        return Truth([{k: outputs[k] for k in ("y", "dx")}], {k: v for k, v in outputs.items()
                                                              if k not in ("y", "dx")},
                     [{k: envelope[k] for k in ("y", "dx")}], {k: v for k, v in envelope.items()
                                                               if k not in ("y", "dx")})
    weights: dict[str, Any] = {n: None if t is None else _f64(t) for n, t in layer_weights(problem, step).items()}
    micro, envelopes = [], []
    grads: dict[str, np.ndarray] = {}
    grad_env: dict[str, tuple[np.ndarray, int]] = {}
    count = 1 if problem.case_id is not None else len(problem.tokens)
    for i in range(count):
        batch = {n: _f64(t) for n, t in layer_batch(problem, i, step, replica).items()}
        if problem.layer == "mlp":
            result = serial.mlp_forward_backward(batch["x"], weights["w1"], weights["b1"], weights["w2"],
                                                 weights["b2"], batch["dy"])._asdict()
        else:
            result = serial.linear_forward_backward(batch["x"], weights["w"], weights["b"], batch["dy"])._asdict()
        env = _envelope(problem, {**{n: t for n, t in weights.items() if t is not None}, **batch})
        micro.append({k: result[k].numpy() for k in ("y", "dx")})
        envelopes.append({k: env[k] for k in ("y", "dx")})
        for name, value in result.items():
            if name in ("y", "dx") or value is None:
                continue
            grads[name] = grads.get(name, 0) + value.numpy()
            mag, k = env[name]
            before = grad_env.get(name)
            grad_env[name] = (mag if before is None else before[0] + mag, k if before is None else before[1] + k)
    if fusion:
        for name, prefill in main_grad_prefill(problem, step).items():
            grads["d" + name] = grads["d" + name] + prefill.double().numpy()
            mag, k = grad_env["d" + name]
            grad_env["d" + name] = (mag + np.abs(prefill.double().numpy()), k)
    return Truth(micro, grads, envelopes, grad_env)


def _envelope(problem: LayerProblem, t: Mapping[str, Any]) -> dict[str, tuple[np.ndarray, int]]:
    if problem.layer == "mlp":
        return numerics.mlp_envelope(t["x"], t["w1"], t.get("b1"), t["w2"], t.get("b2"), t["dy"])
    return numerics.linear_envelope(t["x"], t["w"], t.get("b"), t["dy"])
