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

Every generic argument check is made once, by
:meth:`~coc_impl.validated_call.ValidatedCall.validate`, locally and before
any collective, so a bad call raises the same error on every rank instead of
leaving peers waiting; the backends take the validated call
(``backend.run(call)``) and check only their own limits.

Backends: ``"portable"`` (:mod:`coc_impl.backends.portable`, any device and
any TP, executes a tiling plan with real overlap; ``blocks`` overrides the
plan), ``"atb"`` (:mod:`coc_impl.backends.ascend`; raises
:class:`~coc_impl.errors.CoCBackendUnavailable` with the reason where it
cannot run, :class:`~coc_impl.errors.CoCArgumentError` for an activation dtype
the kernels lack) and ``"auto"`` (atb for every call the MC2 kernels take,
else portable: the reason is logged on ``coc_impl.fused`` at INFO).  Only the
portable backend can honour an explicit ``blocks``: ``"atb"`` rejects it and
``"auto"`` then picks portable.  ``group`` (the TP process group) is required.  The
user-facing fused flag keeps the ATB rule TP = 8 through :func:`check_fused_tp`.

Megatron's layers under ``--coc-fused-kernel`` (:func:`column_forward`,
:func:`row_forward`, the backend :mod:`coc_impl.megatron_patch` routes to) are
the scripted layers' autograd functions run under :func:`planned_blocks`: the
same overlap engine, tiled by the portable plan instead of equal chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from coc_impl import scripted
from coc_impl.backends import ascend, portable
from coc_impl.block_policy import LayerCall, LayerCallKeywords, MatmulSite
from coc_impl.config import FUSED_TP_SIZE
from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable, CoCFusedTPError
from coc_impl.validated_call import OPS, OpName, ValidatedCall

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack

__all__ = [
    "BACKENDS", "OPS", "all_gather_matmul", "all_gather_matmul_v2", "check_fused_tp", "column_forward",
    "matmul_all_reduce", "matmul_reduce_scatter", "planned_blocks", "row_forward",
]

Tensor = torch.Tensor
BACKENDS = ("portable", "atb", "auto")

_log = logging.getLogger(__name__)


def check_fused_tp(tp_size: int) -> None:
    """The fused kernels run at TP = 8 only (ATB restriction)."""
    if tp_size != FUSED_TP_SIZE:
        raise CoCFusedTPError(
            f"--coc-fused-kernel requires --tensor-model-parallel-size {FUSED_TP_SIZE} "
            f"(ATB restriction), got {tp_size}"
        )


def matmul_all_reduce(x: Tensor, w: Tensor, bias: Tensor | None = None, *, group: dist.ProcessGroup,
        transpose_weight: bool = False, deterministic: bool = False, antiquant_scale: Tensor | None = None,
        antiquant_offset: Tensor | None = None, antiquant_group_size: int = 0, backend: str = "portable",
        blocks: Sequence[int] | None = None,
) -> Tensor:
    """``allreduce_sum(x @ w) + bias`` -> ``[m, n]``; int8 ``w`` with antiquant args is w8A16."""
    return _run("matmul_all_reduce", backend, x, w, bias, group=group, transpose_weight=transpose_weight,
                deterministic=deterministic, antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                antiquant_group_size=antiquant_group_size, blocks=blocks)


def matmul_reduce_scatter(x: Tensor, w: Tensor, bias: Tensor | None = None, *, group: dist.ProcessGroup,
        transpose_weight: bool = False, deterministic: bool = False, backend: str = "portable",
        blocks: Sequence[int] | None = None,
) -> Tensor:
    """``reduce_scatter_sum(x @ w)`` along ``m`` -> ``[m/tp, n]`` (+ bias once).

    ``blocks`` tile the ``m/tp`` rows each rank receives.
    """
    return _run("matmul_reduce_scatter", backend, x, w, bias, group=group, transpose_weight=transpose_weight,
                deterministic=deterministic, blocks=blocks)


def all_gather_matmul(x: Tensor, w: Tensor, bias: Tensor | None = None, *, group: dist.ProcessGroup,
        transpose_weight: bool = False, backend: str = "portable", blocks: Sequence[int] | None = None,
) -> Tensor:
    """``all_gather(x) @ w`` -> ``[m*tp, n]`` (+ bias); ``blocks`` tile each rank's ``m`` rows."""
    return _run("all_gather_matmul", backend, x, w, bias, group=group, transpose_weight=transpose_weight, blocks=blocks)


def all_gather_matmul_v2(x: Tensor, w: Tensor, bias: Tensor | None = None, *, group: dist.ProcessGroup,
        transpose_weight: bool = False, backend: str = "portable", blocks: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """``(all_gather(x) @ w (+ bias), all_gather(x))``, gathered rows rank-major."""
    return _run("all_gather_matmul_v2", backend, x, w, bias, group=group, transpose_weight=transpose_weight,
                blocks=blocks)


def _run(op: OpName, backend: str, x: Tensor, w: Tensor, bias: Tensor | None, **kw: Any) -> Any:
    """Every fused op's one path: its arguments validated (a typed error on every rank), then the backend runs it."""
    call = ValidatedCall.validate(op, x, w, bias, **kw)
    return _backend(backend, call).run(call)


def _backend(name: str, call: ValidatedCall) -> ModuleType:
    """The backend module for ``name``; it takes the call with ``run(call)``.

    An explicit tiling can only be honoured by the portable backend: with
    ``"atb"`` it is an error, ``"auto"`` takes it as a request for portable.
    ``"auto"`` asks the Ascend backend whether its kernels take this very call
    (:func:`~coc_impl.backends.ascend.check`, which depends only on the
    arguments, the TP size and the SoC, so every rank decides alike) and runs
    portable otherwise, logging why.
    """
    if name not in BACKENDS:
        raise CoCArgumentError(f"backend must be one of {list(BACKENDS)}, got {name!r}")
    if name == "portable":
        return portable
    if call.blocks is not None:
        if name == "auto":
            return portable
        raise CoCArgumentError(
            f"blocks={list(call.blocks)} cannot be honoured by backend 'atb' (the kernel tiles "
            "internally); use backend='portable'"
        )
    if name == "atb":
        ascend.check(call)  # the declared error, naming the limit and its source
        return ascend
    try:
        ascend.check(call)
    except (CoCArgumentError, CoCBackendUnavailable) as exc:
        _log.info("backend='auto' runs %s on the portable backend: %s", call.op, exc)
        return portable
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


def column_forward(x: Tensor, weight: Tensor, bias: Tensor | None, **keywords: Unpack[LayerCallKeywords]) -> Tensor:
    """:func:`coc_impl.scripted.column_forward` tiled by :func:`planned_blocks`.

    Any TP size runs here; the TP = 8 rule of the flag is the configuration's.
    """
    return scripted.column_forward(x, weight, bias, policy=planned_blocks, **keywords)


def row_forward(x: Tensor, weight: Tensor, bias: Tensor | None, **keywords: Unpack[LayerCallKeywords]) -> Tensor:
    """:func:`coc_impl.scripted.row_forward` tiled by :func:`planned_blocks`."""
    return scripted.row_forward(x, weight, bias, policy=planned_blocks, **keywords)
