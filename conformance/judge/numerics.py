"""Principled comparison of a CoC result against float64 truth (``docs/DESIGN.md#error-bound``).

A blanket relative tolerance is either too loose for fp32 or too tight for
bf16.  Instead every element of the CoC result ``out`` must satisfy

    |out - truth| <= FACTOR * |serial - truth|
                     + (sqrt(R) * u(dtype) + sqrt(K) * u_acc) * magnitude

``truth`` is the float64 result; ``serial`` the plain (non-CoC) path in the same
dtype on the same device; ``magnitude`` the element of ``|A| @ |B|`` (the scale
of its dot products); ``K`` the length of those dot products.  Two kinds of
rounding reach an element:

* accumulation inside a matmul, ``K`` steps at the accumulator's unit roundoff
  ``u_acc`` (fp32 for fp16/bf16 inputs: every device CoC targets accumulates
  half-precision GEMMs in fp32) -- the usual ``sqrt(K) eps |A||B|`` growth;
* roundings to the working dtype, at most ``R`` per element: one per TP
  partial and one per addition summing them (:func:`tp_sum_roundings`), one
  per chunk of a reduction split by the chunking (the weight grads), the bias
  and the final cast.  Chunking along rows adds none.

CoC may reorder sums (chunks, rank order), which moves error inside this
envelope; it may not add error beyond it.  Wrong rows, stale inputs, a doubled
bias or a dropped quantisation offset fall outside it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from conformance.record.comparison import Comparison, ErrorStats

#: How much worse than the serial path's own error CoC may be, elementwise.
FACTOR = 2.0

_UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}


def tp_sum_roundings(tp: int) -> int:
    """Roundings to the working dtype of summing ``tp`` partials there: one per partial and one per addition."""
    return 2 * tp - 1


def unit_roundoff(dtype: Any) -> float:
    """u for a torch or numpy dtype (or its name)."""
    name = str(dtype).replace("torch.", "")
    return _UNIT_ROUNDOFF[name]


def accumulator_roundoff(dtype: Any) -> float:
    """u of the accumulator a matmul of ``dtype`` inputs uses (fp32 for half precision)."""
    u = unit_roundoff(dtype)
    return min(u, unit_roundoff("float32"))


def compare(name: str, out: Any, truth: Any, serial: Any, *, magnitude: Any, reduction_len: int,
            roundings: int, dtype: Any, factor: float = FACTOR) -> Comparison:
    """Compare ``out`` with float64 ``truth`` under the bound in the module docstring.

    All array arguments may be torch tensors or numpy arrays of one shape;
    ``magnitude`` is ``|A| @ |B|`` (float64) for the same elements,
    ``reduction_len`` is K and ``roundings`` is R.
    """
    out64, truth64, serial64, mag = (as_float64(a) for a in (out, truth, serial, magnitude))
    shapes = {a.shape for a in (out64, truth64, serial64, mag)}
    if len(shapes) != 1:
        raise ValueError(f"{name}: shapes differ: out {out64.shape}, truth {truth64.shape}, "
                         f"serial {serial64.shape}, magnitude {mag.shape}")
    diff = np.abs(out64 - truth64)
    serial_diff = np.abs(serial64 - truth64)
    per_magnitude = (math.sqrt(max(roundings, 1)) * unit_roundoff(dtype)
                     + math.sqrt(max(reduction_len, 1)) * accumulator_roundoff(dtype))
    bound = factor * serial_diff + per_magnitude * mag
    nonfinite = ~np.isfinite(out64)
    diff = np.where(nonfinite, np.inf, diff)
    bad = diff > bound
    violations = int(bad.sum())
    first = tuple(int(i) for i in np.argwhere(bad)[0]) if violations else None
    by_row = bad.reshape(-1, bad.shape[-1]) if bad.ndim > 1 else bad.reshape(1, -1)
    bad_rows = tuple(int(r) for r in np.flatnonzero(by_row.any(axis=1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bound > 0, diff / bound, np.where(diff > 0, np.inf, 0.0))
    scale = float(np.abs(truth64).max(initial=0.0))
    significant = np.abs(truth64) > 1e-3 * scale
    truth_norm = float(np.linalg.norm(truth64)) or 1.0
    stats = ErrorStats(
        name=name,
        dtype=str(dtype).replace("torch.", ""),
        shape=tuple(out64.shape),
        max_abs=float(diff.max(initial=0.0)),
        max_rel=float((diff[significant] / np.abs(truth64[significant])).max(initial=0.0)),
        rel_l2=float(np.linalg.norm(np.where(nonfinite, 0.0, diff)) / truth_norm)
        if not nonfinite.any() else math.inf,
        serial_max_abs=float(serial_diff.max(initial=0.0)),
        serial_rel_l2=float(np.linalg.norm(serial_diff) / truth_norm),
        worst_ratio=float(ratio.max(initial=0.0)),
        violations=violations,
        first_violation=first,
        reduction_len=reduction_len,
        bad_rows=bad_rows,
        rows=by_row.shape[0],
    )
    return Comparison(stats, diff, bound)


def magnitude(a: Any, b: Any) -> np.ndarray:
    """``|a| @ |b|`` in float64: the scale of every dot product of ``a @ b``."""
    return np.abs(as_float64(a)) @ np.abs(as_float64(b))


def as_float64(a: Any) -> np.ndarray:
    """A torch tensor or array-like as a float64 numpy array (on the host)."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


#: max |gelu'| and max |gelu''| for the exact erf GELU (envelopes of error propagation).
_GELU_SLOPE, _GELU_CURVE = 1.13, 0.80


def linear_envelope(x: Any, w: Any, b: Any, dy: Any) -> dict[str, tuple[np.ndarray, int]]:
    """``(|A| @ |B|, K)`` of every result of ``y = x @ w.T + b`` and its backward."""
    x2, dy2, w64 = _flat2(x), _flat2(dy), np.abs(as_float64(w))
    m = x2.shape[0]
    env = {
        "y": (x2 @ w64.T + (0 if b is None else np.abs(as_float64(b))), x2.shape[1]),
        "dx": (dy2 @ w64, w64.shape[0]),
        "dw": (dy2.T @ x2, m),
    }
    if b is not None:
        env["db"] = (dy2.sum(0), m)
    return {k: (v.reshape(_out_shape(k, x, dy, w, b)), n) for k, (v, n) in env.items()}


def mlp_envelope(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, dy: Any) -> dict[str, tuple[np.ndarray, int]]:
    """Envelopes for column -> gelu -> row, propagating the first layer's through GELU.

    Rounding in ``h = x @ w1.T + b1`` reaches later results through gelu'
    (at most 1.13) and, in the backward, gelu'' (at most 0.80); the envelope
    of each result adds those propagated terms to its own ``|A| @ |B|``.
    """
    import torch

    import golden.serial as serial

    x2, dy2 = _flat2(x), _flat2(dy)
    w1a, w2a = np.abs(as_float64(w1)), np.abs(as_float64(w2))
    b1a = 0 if b1 is None else np.abs(as_float64(b1))
    h = torch.from_numpy(_flat(x) @ as_float64(w1).T + (0 if b1 is None else as_float64(b1)))
    g = np.abs(serial.gelu(h).numpy())
    dg = _flat(dy) @ as_float64(w2)
    env_h = x2 @ w1a.T + b1a
    env_g = g + _GELU_SLOPE * env_h
    env_dg = dy2 @ w2a
    env_dh = _GELU_SLOPE * env_dg + _GELU_CURVE * np.abs(dg) * env_h
    k = max(x2.shape[1], w1a.shape[0], w2a.shape[0], x2.shape[0])
    env = {
        "y": env_g @ w2a.T + (0 if b2 is None else np.abs(as_float64(b2))) ,
        "dx": env_dh @ w1a,
        "dw1": env_dh.T @ x2,
        "dw2": dy2.T @ env_g,
    }
    if b1 is not None:
        env["db1"] = env_dh.sum(0)
    if b2 is not None:
        env["db2"] = dy2.sum(0)
    lead = tuple(np.shape(x)[:-1])
    for name in ("y", "dx"):
        env[name] = env[name].reshape(lead + (env[name].shape[-1],))
    return {name: (value, k) for name, value in env.items()}


def _flat(a: Any) -> np.ndarray:
    arr = as_float64(a)
    return arr.reshape(-1, arr.shape[-1])


def _flat2(a: Any) -> np.ndarray:
    return np.abs(_flat(a))


def _out_shape(name: str, x: Any, dy: Any, w: Any, b: Any) -> tuple[int, ...]:
    lead = tuple(np.shape(x)[:-1])
    return {"y": lead + (np.shape(w)[0],), "dx": lead + (np.shape(w)[1],), "dw": tuple(np.shape(w)),
            "db": tuple(np.shape(b)) if b is not None else ()}[name]
