"""One fused-op call, validated once: what every backend of :mod:`coc_impl.fused` takes.

Its own module so that data flows one way: :mod:`coc_impl.fused` (the public
ops) builds a :class:`ValidatedCall` and hands it to a backend
(:mod:`coc_impl.backends`); the backends read it and import nothing of
``fused``.  Every generic argument check is made here, locally and before any
collective, so a bad call raises the same error on every rank instead of
leaving peers waiting; a backend checks only its own limits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

from coc_impl.errors import CoCArgumentError, CoCShapeError
from coc_impl.overlap import validate_blocks
from coc_impl.quant import Antiquant, check_antiquant, weight_kn

Tensor = torch.Tensor
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The fused ops, by the name of their function in :mod:`coc_impl.fused` (and in :attr:`ValidatedCall.op`).
OpName = Literal["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2"]
OPS: tuple[OpName, ...] = get_args(OpName)


@dataclass(frozen=True, eq=False)
class ValidatedCall:
    """One call of a fused op, validated once: everything a backend needs.

    Built only by :meth:`validate`, on every rank before any collective, so a
    bad call raises the same error everywhere and no backend checks it again.
    """

    op: OpName
    x: Tensor
    #: As given: ``[k, n]``, or ``[n, k]`` when ``transpose_weight``; int8 under w8A16.
    w: Tensor
    bias: Tensor | None
    group: dist.ProcessGroup
    transpose_weight: bool
    deterministic: bool
    antiquant: Antiquant | None
    #: An explicit tiling of :attr:`tiled_rows` (portable backend only), or None for the plan.
    blocks: tuple[int, ...] | None
    m: int
    k: int
    n: int
    tp: int

    @classmethod
    def validate(
        cls,
        op: OpName,
        x: Any,
        w: Any,
        bias: Any = None,
        *,
        group: Any,
        transpose_weight: Any = False,
        deterministic: Any = False,
        antiquant_scale: Any = None,
        antiquant_offset: Any = None,
        antiquant_group_size: Any = 0,
        blocks: Any = None,
    ) -> ValidatedCall:
        """Every generic check of a fused-op call, in the order the errors are reported."""
        if op not in OPS:
            raise CoCArgumentError(f"op must be one of {list(OPS)}, got {op!r}")
        for name, flag in (("transpose_weight", transpose_weight), ("deterministic", deterministic)):
            if not isinstance(flag, bool):
                raise CoCArgumentError(f"{name} must be True or False, got {flag!r}")
        tp = _check_group(group)
        quantised = op == "matmul_all_reduce"
        if not quantised and (antiquant_scale is not None or antiquant_offset is not None or antiquant_group_size):
            raise CoCArgumentError(f"antiquant arguments apply to matmul_all_reduce only, not {op}")
        k, n = _check_operands(x, w, bias, transpose_weight, allow_int8=quantised)
        antiquant = check_antiquant(
            x, w, antiquant_scale, antiquant_offset, antiquant_group_size, transpose_weight=transpose_weight
        )
        m = x.shape[0]
        if op == "matmul_reduce_scatter" and m % tp:
            raise CoCShapeError(
                f"{op}: m={m} rows cannot be scattered over tp={tp} ranks (m must be a multiple of tp)"
            )
        call = cls(op, x, w, bias, group, transpose_weight, deterministic, antiquant, None, m, k, n, tp)
        if blocks is None:
            return call
        axis = "m/tp" if op == "matmul_reduce_scatter" else "m"
        return replace(call, blocks=_check_blocks(blocks, call.tiled_rows, f"{op}: the tiled axis {axis}"))

    @property
    def tiled_rows(self) -> int:
        """The rows a tiling splits: each rank's ``m/tp`` output rows for reduce-scatter, else ``m``."""
        return self.m // self.tp if self.op == "matmul_reduce_scatter" else self.m

    def add_bias(self, out: Tensor) -> Tensor:
        """The bias once, after the collective, in the output dtype (one rounding)."""
        return out if self.bias is None else out.add_(self.bias)


def _check_group(group: Any) -> int:
    """The TP group's size; the group is required and must include this process."""
    # Silently reducing over WORLD instead of the TP group would be wrong, not slow.
    if not isinstance(group, dist.ProcessGroup):
        raise CoCArgumentError(f"group must be the tensor-parallel ProcessGroup, got {group!r}")
    if group.rank() < 0:
        raise CoCArgumentError("this process is not a member of the given group")
    return group.size()


def _check_operands(
    x: Any, w: Any, bias: Any, transpose_weight: bool, allow_int8: bool = False
) -> tuple[int, int]:
    """Shapes, dtypes and devices of ``x``, ``w`` and ``bias``; returns the logical ``(k, n)``.

    ``allow_int8`` leaves an int8 ``w`` to :func:`~coc_impl.quant.check_antiquant`.
    """
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, Tensor):
            raise CoCArgumentError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise CoCArgumentError(f"{name} must be 2-D, got shape {list(t.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise CoCArgumentError(f"x has dtype {x.dtype}; expected one of {list(FLOAT_DTYPES)}")
    k, n = weight_kn(w, transpose_weight)
    if x.shape[1] != k:
        layout = "[n, k]" if transpose_weight else "[k, n]"
        raise CoCArgumentError(
            f"x is {list(x.shape)} but w is {list(w.shape)} read as {layout} "
            f"(transpose_weight={transpose_weight}): x's k={x.shape[1]} != w's k={k}"
        )
    if w.dtype != x.dtype and not (allow_int8 and w.dtype == torch.int8):
        raise CoCArgumentError(
            f"w has dtype {w.dtype} but x has {x.dtype}; they must match "
            "(an int8 w needs antiquant_scale, matmul_all_reduce only)"
        )
    if w.device != x.device:
        raise CoCArgumentError(f"w is on {w.device} but x is on {x.device}")
    if 0 in (x.shape[0], k, n):
        raise CoCArgumentError(f"empty operands are not supported: m={x.shape[0]}, k={k}, n={n}")
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise CoCArgumentError(f"bias must be a tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (n,):
            raise CoCArgumentError(f"bias must have shape [n={n}], got {list(bias.shape)}")
        if bias.dtype != x.dtype:
            raise CoCArgumentError(f"bias has dtype {bias.dtype}; it must match x's dtype {x.dtype}")
        if bias.device != x.device:
            raise CoCArgumentError(f"bias is on {bias.device} but x is on {x.device}")
    return k, n


def _check_blocks(blocks: Any, rows: int, what: str) -> tuple[int, ...]:
    """An explicit tiling must cover the tiled axis exactly with positive blocks."""
    try:
        sizes = tuple(blocks)
    except TypeError:
        raise CoCShapeError(f"blocks must be a sequence of row counts, got {blocks!r}") from None
    return validate_blocks(sizes, rows, what=what)

