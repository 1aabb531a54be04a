"""Serial (un-sharded) definitions of every golden case.

These are explicit formulas on torch tensors, not autograd, so the same
functions give the stored float64 goldens *and* the live serial run in any dtype
on any device. The global maths of a column and a row parallel layer is the same
linear map (they differ only in sharding), and so is the product behind every
fused op; the named aliases exist so call sites read like the design (``docs/DESIGN.md#fused-ops``).

Conventions: Megatron weights are ``[out, in]`` (``y = x @ w.T``); op weights are
``[k, n]`` (``y = x @ w``); GELU is the exact erf form, not the tanh approximation.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

GELU = "erf"  # recorded in the manifest: torch.nn.functional.gelu(approximate="none")


class LinearGrads(NamedTuple):
    y: Tensor
    dx: Tensor
    dw: Tensor
    db: Tensor | None


class MlpGrads(NamedTuple):
    y: Tensor
    dx: Tensor
    dw1: Tensor
    db1: Tensor | None
    dw2: Tensor
    db2: Tensor | None


def _flat(t: Tensor) -> Tensor:
    """``[s, b, h] -> [s*b, h]``: weight grads sum over every token."""
    return t.reshape(-1, t.shape[-1])


def linear_forward_backward(x: Tensor, w: Tensor, b: Tensor | None, dy: Tensor) -> LinearGrads:
    """``y = x @ w.T + b`` and its grads for upstream ``dy`` (``w`` is ``[out, in]``)."""
    y = x @ w.T if b is None else x @ w.T + b
    db = None if b is None else _flat(dy).sum(0)
    return LinearGrads(y, dy @ w, _flat(dy).T @ _flat(x), db)


def gelu(h: Tensor) -> Tensor:
    return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))


def gelu_grad(h: Tensor) -> Tensor:
    """``d gelu / dh = Phi(h) + h * phi(h)`` for the exact erf GELU."""
    cdf = 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)
    return cdf + h * pdf


def mlp_forward_backward(x: Tensor, w1: Tensor, b1: Tensor | None, w2: Tensor,
                         b2: Tensor | None, dy: Tensor) -> MlpGrads:
    """Megatron MLP: column (``w1 [ffn, h_in]``) -> GELU -> row (``w2 [h_out, ffn]``)."""
    h = x @ w1.T if b1 is None else x @ w1.T + b1
    a = gelu(h)
    second = linear_forward_backward(a, w2, b2, dy)
    first = linear_forward_backward(x, w1, b1, second.dx * gelu_grad(h))
    return MlpGrads(second.y, first.dx, first.dw, first.db, second.dw, second.db)


def matmul(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x [m, k] @ w [k, n] (+ bias [n])``: the global result of every fused op."""
    return x @ w if bias is None else x @ w + bias


def dequantize(w: Tensor, scale: Tensor, offset: Tensor | None = None,
               group_size: int | None = None) -> Tensor:
    """w8A16 anti-quantisation ``(w + offset) * scale`` in ``scale.dtype``.

    ``scale``/``offset`` are ``[1]`` (per-tensor) or ``[n]`` (per-channel), both of
    which broadcast over ``w [k, n]``; with ``group_size = g`` they are
    ``[ceil(k/g), n]`` and row ``i`` of ``w`` uses group ``i // g``.
    """
    if group_size is not None:
        k = w.shape[0]
        if scale.shape[0] != math.ceil(k / group_size):
            raise ValueError(f"per-group scale needs {math.ceil(k / group_size)} rows for "
                             f"k={k}, g={group_size}; got shape {tuple(scale.shape)}")
        scale = scale.repeat_interleave(group_size, dim=0)[:k]
        offset = None if offset is None else offset.repeat_interleave(group_size, dim=0)[:k]
    wf = w.to(scale.dtype)
    return (wf if offset is None else wf + offset.to(scale.dtype)) * scale


def quant_matmul_all_reduce(x: Tensor, w: Tensor, scale: Tensor, offset: Tensor | None = None,
                            bias: Tensor | None = None, group_size: int | None = None) -> Tensor:
    """w8A16 ``matmul_all_reduce``: ``x @ dequantize(w, ...) (+ bias)``."""
    return matmul(x, dequantize(w, scale, offset, group_size), bias)
