"""w8A16 pseudo-quantisation of the fused ``matmul_all_reduce`` weight (``docs/DESIGN.md#fused-ops``).

The fused MATMUL_ALL_REDUCE kernel takes an int8 weight with a float16 or
bfloat16 activation and dequantises on the fly, halving the weight's memory
traffic.  The granularity is read from the shape of ``antiquant_scale``, always
in terms of the *logical* ``[k, n]`` weight, whatever its storage
(``transpose_weight=True`` stores it ``[n, k]``):

==============  ========================  ==========================
granularity     ``antiquant_scale`` shape  ``antiquant_group_size``
==============  ========================  ==========================
per-tensor      ``[1]``                   0
per-channel     ``[n]`` (or ``[1, n]``)   0
per-group       ``[ceil(k/g), n]``        ``g``: multiple of 32, ``32 <= g < k``
==============  ========================  ==========================

``antiquant_offset`` is optional and has the shape and dtype of the scale;
rows ``[i*g, (i+1)*g)`` of the weight use row ``i`` of a per-group scale.

Dequantisation: ``w_f = (w + offset) * scale``, evaluated in float32 and
rounded once to the activation dtype.  It happens **once per call**, not per
tile: the pipeline tiles ``m`` and never the weight, so per-tile dequantisation
would repeat identical work.  After it the op is exactly the unquantised op on
the dequantised weight -- ``matmul_all_reduce(x, w8, scale=s)`` equals
``matmul_all_reduce(x, dequantize(w8, ...))`` bit for bit, deterministic mode
included -- which keeps quantisation orthogonal to tiling and reduction.

:func:`check_antiquant` is part of the fused ops' single validation
(:meth:`coc_impl.validated_call.ValidatedCall.validate`), run locally before any collective, so
a bad argument raises the same :class:`~coc_impl.errors.CoCArgumentError` on
every rank; the backends take the resulting :class:`Antiquant`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from coc_impl.errors import CoCArgumentError

Granularity = Literal["tensor", "channel", "group"]

#: Activation dtypes the w8A16 kernels accept.
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
#: Per-group sizes must be multiples of this.
GROUP_ALIGN = 32


@dataclass(frozen=True)
class Antiquant:
    """Validated antiquant arguments of one call."""

    scale: torch.Tensor
    offset: torch.Tensor | None
    group_size: int
    granularity: Granularity
    dtype: torch.dtype  # the activation dtype the weight is dequantised to


def weight_kn(w: torch.Tensor, transpose_weight: bool) -> tuple[int, int]:
    """``(k, n)`` of the logical weight; the flag, never the shape, decides."""
    return (w.shape[1], w.shape[0]) if transpose_weight else (w.shape[0], w.shape[1])


def check_antiquant(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None,
    offset: torch.Tensor | None,
    group_size: int,
    *,
    transpose_weight: bool,
) -> Antiquant | None:
    """Validate the antiquant arguments; ``None`` when the call is not quantised.

    ``x`` and ``w`` must already be 2-D with matching ``k`` (the fused op
    checks that first).  Every defect raises :class:`CoCArgumentError` naming
    the offending argument.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0:
        raise CoCArgumentError(
            f"antiquant_group_size must be a non-negative int, got {group_size!r}"
        )
    if scale is None:
        if offset is not None:
            raise CoCArgumentError("antiquant_offset was given without antiquant_scale")
        if group_size:
            raise CoCArgumentError(
                f"antiquant_group_size={group_size} was given without antiquant_scale"
            )
        if w.dtype == torch.int8:
            raise CoCArgumentError(
                "w is int8 but antiquant_scale is missing: a w8A16 weight needs antiquant_scale"
            )
        return None

    if w.dtype != torch.int8:
        raise CoCArgumentError(
            f"antiquant_scale was given but w has dtype {w.dtype}; w8A16 needs an int8 w"
        )
    if x.dtype not in ACTIVATION_DTYPES:
        raise CoCArgumentError(
            f"x has dtype {x.dtype}; w8A16 (int8 w) needs x in float16 or bfloat16"
        )
    k, n = weight_kn(w, transpose_weight)
    _check_tensor("antiquant_scale", scale, x)
    if group_size:
        if group_size % GROUP_ALIGN or not GROUP_ALIGN <= group_size < k:
            raise CoCArgumentError(
                f"antiquant_group_size={group_size} must be a multiple of {GROUP_ALIGN} "
                f"with {GROUP_ALIGN} <= antiquant_group_size < k={k}"
            )
        expected = (-(-k // group_size), n)
        if tuple(scale.shape) != expected:
            raise CoCArgumentError(
                f"antiquant_group_size={group_size} needs a per-group antiquant_scale of shape "
                f"[ceil(k/g), n] = {list(expected)}, got {list(scale.shape)}"
            )
        granularity: Granularity = "group"
    elif tuple(scale.shape) in ((n,), (1, n)):
        granularity = "channel"
    elif tuple(scale.shape) == (1,):
        granularity = "tensor"
    else:
        raise CoCArgumentError(
            f"antiquant_scale has shape {list(scale.shape)}; expected per-tensor [1] or "
            f"per-channel [n={n}] or [1, n] (a per-group scale also needs antiquant_group_size)"
        )
    if offset is not None:
        _check_tensor("antiquant_offset", offset, x)
        if offset.shape != scale.shape:
            raise CoCArgumentError(
                f"antiquant_offset has shape {list(offset.shape)}; it must match "
                f"antiquant_scale's {list(scale.shape)}"
            )
    return Antiquant(scale, offset, group_size, granularity, x.dtype)


def _check_tensor(name: str, t: object, x: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise CoCArgumentError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype != x.dtype:
        raise CoCArgumentError(f"{name} has dtype {t.dtype}; it must match x's dtype {x.dtype}")
    if t.device != x.device:
        raise CoCArgumentError(f"{name} is on {t.device} but x is on {x.device}")


def dequantize(w: torch.Tensor, aq: Antiquant, *, transpose_weight: bool) -> torch.Tensor:
    """``(w + offset) * scale`` in float32, rounded once to ``aq.dtype``.

    The result keeps ``w``'s storage layout (``[n, k]`` when
    ``transpose_weight``), so the caller goes on exactly as for a float weight.
    """
    w_kn = w.t() if transpose_weight else w
    scale = aq.scale.float()
    offset = None if aq.offset is None else aq.offset.float()
    if aq.granularity == "group":
        k = w_kn.shape[0]
        scale = scale.repeat_interleave(aq.group_size, dim=0)[:k]
        if offset is not None:
            offset = offset.repeat_interleave(aq.group_size, dim=0)[:k]
    w_f = w_kn.float()
    if offset is not None:
        w_f = w_f + offset
    w_f = (w_f * scale).to(aq.dtype)
    return w_f.t() if transpose_weight else w_f
