"""The fused CoC ops (``docs/DESIGN.md#fused-ops``): one validated front door, several backends.

Per rank of a TP group of size ``tp`` (``w`` is the logical ``[k, n]`` weight,
stored ``[n, k]`` when ``transpose_weight=True``; the flag alone decides, a
square weight is never re-interpreted from its shape):

* :func:`matmul_all_reduce` -- ``allreduce_sum(x @ w) + bias`` -> ``[m, n]``
* :func:`matmul_reduce_scatter` -- ``reduce_scatter_sum(x @ w)`` along ``m``
  -> ``[m/tp, n]`` (+ bias), rank ``r`` keeping rows ``[r*m/tp, (r+1)*m/tp)``
* :func:`all_gather_matmul` -- ``all_gather(x) @ w`` -> ``[m*tp, n]`` (+ bias)
* :func:`all_gather_matmul_v2` -- the same and the gathered ``x`` ``[m*tp, k]``,
  rank-major exactly as one serial all-gather

Dtypes: ``x``, ``w`` (unless int8 under w8A16) and ``bias`` share one floating
dtype, which is the output dtype.  The bias is added exactly once, after the
reduction: in the output dtype (one rounding) normally, in float32 before the
single final cast under ``deterministic=True`` (see
:mod:`coc_impl.deterministic`).

Every generic argument check is made once, by :meth:`OpCall.validate`, locally
and before any collective, so a bad call raises the same error on every rank
instead of leaving peers waiting; the backends take the validated
:class:`OpCall` (``backend.run(call)``) and check only their own limits.

Backends: ``"portable"`` (:mod:`coc_impl.backends.portable`, any device and
any TP, executes a tiling plan with real overlap; ``blocks`` overrides the
plan), ``"atb"`` (:mod:`coc_impl.backends.ascend`; raises
:class:`~coc_impl.errors.CoCBackendUnavailable` with the reason where it
cannot run) and ``"auto"`` (atb where available, else portable).  Only the
portable backend can honour an explicit ``blocks``: ``"atb"`` rejects it and
``"auto"`` then picks portable.  ``group`` (the TP process group) is required.  The
user-facing fused flag keeps the ATB rule TP = 8 through :func:`check_fused_tp`.

Megatron's layers under ``--coc-fused-kernel`` (:func:`column_forward`,
:func:`row_forward`, the backend :mod:`coc_impl.megatron_patch` routes to) are
the scripted layers' autograd functions run under :func:`planned_blocks`: the
same overlap engine, tiled by the portable plan instead of equal chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

from coc_impl import scripted
from coc_impl.backends import ascend, portable
from coc_impl.config import FUSED_TP_SIZE, CoCConfig
from coc_impl.errors import CoCArgumentError, CoCFusedTPError, CoCShapeError
from coc_impl.quant import Antiquant, check_antiquant, weight_kn
from coc_impl.scripted import LayerCall, MatmulSite

Tensor = torch.Tensor
BACKENDS = ("portable", "atb", "auto")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: The fused ops, by the name of their function here (and in :attr:`OpCall.op`).
OpName = Literal["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2"]
OPS: tuple[OpName, ...] = get_args(OpName)


def check_fused_tp(tp_size: int) -> None:
    """The fused kernels run at TP = 8 only (ATB restriction)."""
    if tp_size != FUSED_TP_SIZE:
        raise CoCFusedTPError(
            f"--coc-fused-kernel requires --tensor-model-parallel-size {FUSED_TP_SIZE} "
            f"(ATB restriction), got {tp_size}"
        )


@dataclass(frozen=True, eq=False)
class OpCall:
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
    ) -> OpCall:
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
        return replace(call, blocks=_check_blocks(blocks, call.tiled_rows, axis))

    @property
    def tiled_rows(self) -> int:
        """The rows a tiling splits: each rank's ``m/tp`` output rows for reduce-scatter, else ``m``."""
        return self.m // self.tp if self.op == "matmul_reduce_scatter" else self.m

    def add_bias(self, out: Tensor) -> Tensor:
        """The bias once, after the collective, in the output dtype (one rounding)."""
        return out if self.bias is None else out.add_(self.bias)


def matmul_all_reduce(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    deterministic: bool = False,
    antiquant_scale: Tensor | None = None,
    antiquant_offset: Tensor | None = None,
    antiquant_group_size: int = 0,
    backend: str = "portable",
    blocks: Sequence[int] | None = None,
) -> Tensor:
    """``allreduce_sum(x @ w) + bias`` -> ``[m, n]``; int8 ``w`` with antiquant args is w8A16."""
    call = OpCall.validate(
        "matmul_all_reduce", x, w, bias, group=group, transpose_weight=transpose_weight,
        deterministic=deterministic, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
        antiquant_group_size=antiquant_group_size, blocks=blocks,
    )
    return _backend(backend, call).run(call)


def matmul_reduce_scatter(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    deterministic: bool = False,
    backend: str = "portable",
    blocks: Sequence[int] | None = None,
) -> Tensor:
    """``reduce_scatter_sum(x @ w)`` along ``m`` -> ``[m/tp, n]`` (+ bias once).

    ``blocks`` tile the ``m/tp`` rows each rank receives.
    """
    call = OpCall.validate(
        "matmul_reduce_scatter", x, w, bias, group=group, transpose_weight=transpose_weight,
        deterministic=deterministic, blocks=blocks,
    )
    return _backend(backend, call).run(call)


def all_gather_matmul(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    backend: str = "portable",
    blocks: Sequence[int] | None = None,
) -> Tensor:
    """``all_gather(x) @ w`` -> ``[m*tp, n]`` (+ bias); ``blocks`` tile each rank's ``m`` rows."""
    call = OpCall.validate(
        "all_gather_matmul", x, w, bias, group=group, transpose_weight=transpose_weight, blocks=blocks
    )
    return _backend(backend, call).run(call)


def all_gather_matmul_v2(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: dist.ProcessGroup,
    transpose_weight: bool = False,
    backend: str = "portable",
    blocks: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """``(all_gather(x) @ w (+ bias), all_gather(x))``, gathered rows rank-major."""
    call = OpCall.validate(
        "all_gather_matmul_v2", x, w, bias, group=group, transpose_weight=transpose_weight, blocks=blocks
    )
    return _backend(backend, call).run(call)


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


def _check_blocks(blocks: Any, rows: int, axis: str) -> tuple[int, ...]:
    """An explicit tiling must cover the tiled axis exactly with positive blocks."""
    try:
        sizes = tuple(blocks)
    except TypeError:
        raise CoCShapeError(f"blocks must be a sequence of row counts, got {blocks!r}") from None
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in sizes):
        raise CoCShapeError(f"blocks must be positive integers, got {list(sizes)}")
    if sum(sizes) != rows:
        raise CoCShapeError(
            f"blocks {list(sizes)} sum to {sum(sizes)} but the tiled axis {axis} has {rows} rows"
        )
    return sizes


def _backend(name: str, call: OpCall) -> ModuleType:
    """The backend module for ``name``; it takes the call with ``run(call)``.

    An explicit tiling can only be honoured by the portable backend: with
    ``"atb"`` it is an error, ``"auto"`` takes it as a request for portable.
    """
    if name not in BACKENDS:
        raise CoCArgumentError(f"backend must be one of {list(BACKENDS)}, got {name!r}")
    if name == "portable" or (name == "auto" and (call.blocks is not None or not ascend.is_available())):
        return portable
    if call.blocks is not None:
        raise CoCArgumentError(
            f"blocks={list(call.blocks)} cannot be honoured by backend 'atb' (the kernel tiles "
            "internally); use backend='portable'"
        )
    ascend.load()  # CoCBackendUnavailable with the reason where it cannot run
    return ascend


def planned_blocks(call: LayerCall, site: MatmulSite) -> tuple[int, ...]:
    """The fused kernel's tiling of one layer matmul: the portable plan.

    ``parallel_num`` and ``customized_coc`` do not apply (the configuration
    warns).  The column backward's dx collective is pipelined only with
    ``enable_coc_in_column_backward``; otherwise it is one block (matmul,
    then the collective), since megatron already overlaps it with the dw
    matmul.
    """
    if site.column_backward and not call.config.user_cfgs.enable_coc_in_column_backward:
        return (site.split_rows,)
    return portable.plan(
        site.split_rows, site.m // site.split_rows, site.k, site.n, site.itemsize,
        comm_width=site.k if site.gathers else None,
    )


def column_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    *,
    group: dist.ProcessGroup,
    sequence_parallel: bool,
    config: CoCConfig,
    gradient_accumulation_fusion: bool = False,
) -> Tensor:
    """:func:`coc_impl.scripted.column_forward` tiled by :func:`planned_blocks`.

    Any TP size runs here; the TP = 8 rule of the flag is the configuration's.
    """
    return scripted.column_forward(
        x, weight, bias, group=group, sequence_parallel=sequence_parallel, config=config,
        gradient_accumulation_fusion=gradient_accumulation_fusion, policy=planned_blocks,
    )


def row_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    *,
    group: dist.ProcessGroup,
    sequence_parallel: bool,
    config: CoCConfig,
    gradient_accumulation_fusion: bool = False,
) -> Tensor:
    """:func:`coc_impl.scripted.row_forward` tiled by :func:`planned_blocks`."""
    return scripted.row_forward(
        x, weight, bias, group=group, sequence_parallel=sequence_parallel, config=config,
        gradient_accumulation_fusion=gradient_accumulation_fusion, policy=planned_blocks,
    )
