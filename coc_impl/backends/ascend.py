"""Ascend backend of the fused CoC ops: torch_npu's MC2 kernels over HCCL.

This is the only module of the project that imports ``torch_npu``, and it does
so lazily (:func:`load`), so importing it on a machine without an NPU is cheap
and has no side effects.  Every op checks its arguments on the host first
(:class:`CoCArgumentError` / :class:`CoCShapeError`, so the checks run on CPU),
then asks for the runtime (:class:`CoCBackendUnavailable`, carrying the reason),
and only then touches the device.

Binding (MC2 kernels, CANN / torch_npu 8.0.RC2 or later):

=======================  ==============================================
op                       torch_npu kernel
=======================  ==============================================
matmul_all_reduce        ``npu_mm_all_reduce_base(x1, x2, hcom, ...)``
matmul_reduce_scatter    ``npu_mm_reduce_scatter_base(x1, x2, hcom, world_size, ...)``
all_gather_matmul(_v2)   ``npu_all_gather_base_mm(x1, x2, hcom, world_size, gather_output=...)``
=======================  ==============================================

* Weights: MC2 reads ``x2`` as a logical ``[k, n]`` matrix, stored either ND or
  as the transposed view of an ND ``[n, k]`` tensor.  ``transpose_weight=True``
  is honoured by passing ``w.t()`` (a view, no copy); transposition is never
  inferred from shapes, which is ambiguous for square weights.
* Bias: the kernels' documented formula is ``reduce(x1 @ x2 + bias)``, i.e. a
  bias handed to them is added on every rank before the reduction (``tp``
  times), and the all-gather / reduce-scatter kernels reject a non-zero bias.  Bias is
  therefore never given to MC2; it is added once to the result.
* Communicator: MC2 names the HCCL communicator by string, taken from the
  group's HCCL backend with ``get_hccl_comm_name(global_rank)``.
* w8A16: ``antiquant_scale`` / ``antiquant_offset`` / ``antiquant_group_size``
  pass straight to ``npu_mm_all_reduce_base``, whose dequantisation
  ``(x2 + offset) * scale`` is the spec's.

Determinism: Ascend makes HCCL's own reductions reproducible with
``HCCL_DETERMINISTIC=true`` (``strict`` also fixes their order) and ``torch.mm``
with ``torch.use_deterministic_algorithms(True)``.  Neither gives the order the
spec defines (:mod:`coc_impl.deterministic`: float32 partials summed in
ascending rank order, bias in float32, one cast), and that switch is documented
for HCCL's collectives, not for the MC2 kernels.  So ``deterministic=True``
does not use MC2: it runs the portable pipeline
(:mod:`coc_impl.backends.portable`) on the NPU over HCCL, whose reducer moves
the float32 partials by pure data movement (all-gather / all-to-all, bit exact)
and sums them locally in rank order -- the definition itself, still overlapped
block by block, just not fused.  The per-rank matmul is reproducible only
under ``torch.use_deterministic_algorithms(True)`` (set once at rank start-up,
before the first NPU op); without it the op raises
:class:`CoCBackendUnavailable` rather than claim determinism.

ATB: MindSpeed's fused CoC reaches ATB's ``LinearParallelOperation`` (backend
``lcoc``) through its own C++ extension; torch_npu exposes no such op.  The
NNAL ``torch_atb`` bindings do, but their input order per parallel type and
their residual semantics are not documented precisely enough to bind without
hardware, and they have no determinism switch, so MC2 is the binding here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from coc_impl.backends import portable
from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable, CoCShapeError
from coc_impl.quant import check_antiquant, weight_kn

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

__all__ = [
    "MC2_OPS",
    "VISIBLE_DEVICES_ENV",
    "all_gather_matmul",
    "all_gather_matmul_v2",
    "bind_device",
    "init_process_group_kwargs",
    "is_available",
    "load",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "unavailable_reason",
    "visible_devices_env",
]

#: Read by the Ascend runtime when it starts: the physical devices a process sees.
VISIBLE_DEVICES_ENV = "ASCEND_RT_VISIBLE_DEVICES"
#: The torch_npu kernels this backend binds to.
MC2_OPS = ("npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base", "npu_all_gather_base_mm")

#: Activation dtypes of the MC2 kernels (int8 only for their fully quantised modes).
_MC2_DTYPES = (torch.float16, torch.bfloat16)
#: ``k`` range of the MC2 all-gather / reduce-scatter kernels, ``[lo, hi)``.
_MC2_GATHER_SCATTER_K = (256, 65535)
#: Upper bound of ``k`` and ``n`` in the MC2 w8A16 all-reduce kernel.
_MC2_ANTIQUANT_MAX = 65535


# --------------------------------------------------------------------------- runtime


@functools.cache
def _probe() -> tuple[ModuleType | None, str | None]:
    """Import torch_npu once and say why the backend cannot run, if it cannot."""
    try:
        import torch_npu
    except Exception as exc:  # ImportError, or OSError/RuntimeError from a broken CANN install
        return None, f"torch_npu is not importable: {type(exc).__name__}: {exc}"
    try:
        count = torch_npu.npu.device_count() if torch_npu.npu.is_available() else 0
    except Exception as exc:
        return None, f"the NPU runtime failed to start: {type(exc).__name__}: {exc}"
    if count < 1:
        visible = os.environ.get(VISIBLE_DEVICES_ENV)
        where = f" ({VISIBLE_DEVICES_ENV}={visible})" if visible is not None else ""
        return None, f"no NPU device visible{where}"
    missing = [name for name in MC2_OPS if not hasattr(torch_npu, name)]
    if missing:
        version = getattr(torch_npu, "__version__", "?")
        return None, (
            f"torch_npu {version} lacks the MC2 ops {', '.join(missing)} "
            "(they need torch_npu / CANN 8.0.RC2 or later)"
        )
    return torch_npu, None


def load() -> ModuleType:
    """The ``torch_npu`` module, or :class:`CoCBackendUnavailable` with the reason."""
    module, reason = _probe()
    if module is None:
        raise CoCBackendUnavailable(f"Ascend backend unavailable: {reason}")
    return module


def is_available() -> bool:
    """True when torch_npu imports, an NPU is visible and the MC2 ops exist."""
    return _probe()[0] is not None


def unavailable_reason() -> str | None:
    """Why :func:`is_available` is False (None when it is True)."""
    return _probe()[1]


def _npu_device(index: int | None = None) -> torch.device:
    """The NPU device; the ``npu`` type exists only once torch_npu is imported."""
    return torch.device("npu", index) if index is not None else torch.device("npu")


# --------------------------------------------------------------------------- rank set-up


def visible_devices_env(device_ids: Sequence[int]) -> dict[str, str]:
    """Environment that binds a rank to ``device_ids``.

    It must be in the rank's environment before torch_npu starts the runtime
    (set it when launching the process); the rank then sees the devices as
    local indices ``0..len(device_ids)-1``.
    """
    ids = list(device_ids)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i < 0]
    if not ids or bad or len(set(ids)) != len(ids):
        raise CoCArgumentError(f"device_ids must be distinct non-negative ints, got {ids!r}")
    return {VISIBLE_DEVICES_ENV: ",".join(map(str, ids))}


def bind_device(local_index: int = 0) -> torch.device:
    """Make local NPU ``local_index`` this process's current device and return it."""
    load().npu.set_device(local_index)
    return _npu_device(local_index)


def init_process_group_kwargs() -> dict[str, Any]:
    """Keyword arguments of ``torch.distributed.init_process_group`` for HCCL ranks.

    Loads torch_npu first: importing it is what registers the ``hccl`` backend.
    """
    load()
    return {"backend": "hccl"}


# --------------------------------------------------------------------------- fused ops


def matmul_all_reduce(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: ProcessGroup,
    transpose_weight: bool = False,
    deterministic: bool = False,
    antiquant_scale: Tensor | None = None,
    antiquant_offset: Tensor | None = None,
    antiquant_group_size: int = 0,
) -> Tensor:
    """``allreduce_sum(x @ w) + bias`` -> ``[m, n]``; ``w`` is ``[k, n]`` (``[n, k]`` if transposed).

    w8A16: an int8 ``w`` with ``x`` float16/bfloat16 and the antiquant
    arguments of :mod:`coc_impl.quant`.
    """
    op = "matmul_all_reduce"
    _, k, n = _check_operands(op, x, w, bias, transpose_weight, int8_weight_ok=True)
    antiquant = check_antiquant(
        x, w, antiquant_scale, antiquant_offset, antiquant_group_size, transpose_weight=transpose_weight
    )
    _group_size(op, group)
    npu = load()
    if deterministic:
        _require_deterministic_algorithms(op)
        return portable.matmul_all_reduce(
            x, w, bias, group=group, transpose_weight=transpose_weight, deterministic=True,
            antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
            antiquant_group_size=antiquant_group_size,
        )
    kwargs: dict[str, Any] = {"reduce_op": "sum", "comm_turn": 0}
    if antiquant is not None:
        if max(k, n) > _MC2_ANTIQUANT_MAX:
            raise CoCBackendUnavailable(
                f"{op}: the MC2 w8A16 kernel needs k, n <= {_MC2_ANTIQUANT_MAX}, got k={k}, n={n}"
            )
        # Only what is set, so torch_npu releases without per-group support still bind.
        kwargs["antiquant_scale"] = antiquant.scale
        if antiquant.offset is not None:
            kwargs["antiquant_offset"] = antiquant.offset
        if antiquant.group_size:
            kwargs["antiquant_group_size"] = antiquant.group_size
    out = npu.npu_mm_all_reduce_base(
        x.contiguous(), _weight_kn(w, transpose_weight), _hccl_comm_name(group), **kwargs
    )
    return _add_bias(out, bias)


def matmul_reduce_scatter(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: ProcessGroup,
    transpose_weight: bool = False,
    deterministic: bool = False,
) -> Tensor:
    """``reduce_scatter_sum(x @ w)`` along m, plus ``bias`` once -> ``[m/tp, n]``."""
    op = "matmul_reduce_scatter"
    m, k, _ = _check_operands(op, x, w, bias, transpose_weight)
    tp = _group_size(op, group)
    if m % tp:
        raise CoCShapeError(
            f"{op}: m={m} rows cannot be reduce-scattered over tp={tp} ranks (m % tp = {m % tp})"
        )
    npu = load()
    if deterministic:
        _require_deterministic_algorithms(op)
        return portable.matmul_reduce_scatter(
            x, w, bias, group=group, transpose_weight=transpose_weight, deterministic=True
        )
    _check_mc2_k(op, k)
    out = npu.npu_mm_reduce_scatter_base(
        x.contiguous(), _weight_kn(w, transpose_weight), _hccl_comm_name(group), tp,
        reduce_op="sum", comm_turn=0,
    )
    return _add_bias(out, bias)


def all_gather_matmul(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: ProcessGroup,
    transpose_weight: bool = False,
) -> Tensor:
    """``all_gather(x) @ w + bias`` -> ``[m*tp, n]``, rows in rank-major order."""
    out, _ = _all_gather_matmul("all_gather_matmul", x, w, bias, group, transpose_weight, False)
    return out


def all_gather_matmul_v2(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    group: ProcessGroup,
    transpose_weight: bool = False,
) -> tuple[Tensor, Tensor]:
    """As :func:`all_gather_matmul`, also returning the gathered ``x`` ``[m*tp, k]``."""
    return _all_gather_matmul("all_gather_matmul_v2", x, w, bias, group, transpose_weight, True)


def _all_gather_matmul(
    op: str,
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    group: ProcessGroup,
    transpose_weight: bool,
    gather_output: bool,
) -> tuple[Tensor, Tensor]:
    _, k, _ = _check_operands(op, x, w, bias, transpose_weight)
    tp = _group_size(op, group)
    npu = load()
    _check_mc2_k(op, k)
    out, gathered = npu.npu_all_gather_base_mm(
        x.contiguous(),
        _weight_kn(w, transpose_weight),
        _hccl_comm_name(group),
        tp,
        gather_index=0,
        gather_output=gather_output,
        comm_turn=0,
    )
    return _add_bias(out, bias), gathered


# --------------------------------------------------------------------------- checks


def _check_operands(
    op: str,
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    transpose_weight: bool,
    *,
    int8_weight_ok: bool = False,
) -> tuple[int, int, int]:
    """Validate ``x``, ``w``, ``bias`` against what the MC2 kernels take; return ``(m, k, n)``.

    An int8 ``w`` (when allowed) is left to :func:`coc_impl.quant.check_antiquant`.
    """
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise CoCArgumentError(f"{op}: {name} must be a 2-D tensor, got {got}")
    if not isinstance(transpose_weight, bool):
        raise CoCArgumentError(f"{op}: transpose_weight must be a bool, got {transpose_weight!r}")
    if x.dtype not in _MC2_DTYPES:
        why = " (w8A16 needs float16/bfloat16 activations)" if w.dtype == torch.int8 else ""
        raise CoCArgumentError(f"{op}: x must be float16 or bfloat16 on Ascend, got {x.dtype}{why}")
    if w.dtype == torch.int8:
        if not int8_weight_ok:
            raise CoCArgumentError(f"{op}: int8 weights (w8A16) are supported by matmul_all_reduce only")
    elif w.dtype != x.dtype:
        raise CoCArgumentError(f"{op}: w dtype {w.dtype} must match x dtype {x.dtype} (or be int8)")
    m, k = x.shape
    wk, n = weight_kn(w, transpose_weight)
    if wk != k:
        layout = "[n, k]" if transpose_weight else "[k, n]"
        raise CoCArgumentError(
            f"{op}: x is [m={m}, k={k}] but w {tuple(w.shape)} read as {layout} "
            f"(transpose_weight={transpose_weight}) has k={wk}"
        )
    if 0 in (m, k, n):
        raise CoCArgumentError(f"{op}: empty operands are not supported (m={m}, k={k}, n={n})")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,):
            got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise CoCArgumentError(f"{op}: bias must be a 1-D tensor [n={n}], got {got}")
        if bias.dtype != x.dtype:
            raise CoCArgumentError(f"{op}: bias dtype {bias.dtype} must match x dtype {x.dtype}")
    return m, k, n


def _group_size(op: str, group: ProcessGroup) -> int:
    """Size of the TP group, which this process must belong to."""
    if group is None:
        raise CoCArgumentError(f"{op}: group is required (the tensor-parallel process group)")
    if group.rank() < 0:
        raise CoCArgumentError(f"{op}: this process is not a member of the given group")
    return group.size()


def _check_mc2_k(op: str, k: int) -> None:
    lo, hi = _MC2_GATHER_SCATTER_K
    if not lo <= k < hi:
        raise CoCBackendUnavailable(f"{op}: the MC2 kernel needs {lo} <= k < {hi}, got k={k}")


def _require_deterministic_algorithms(op: str) -> None:
    if not torch.are_deterministic_algorithms_enabled():
        raise CoCBackendUnavailable(
            f"{op}(deterministic=True) on Ascend needs torch.use_deterministic_algorithms(True), "
            "set once at rank start-up before the first NPU op, so the per-rank matmul is reproducible"
        )


# --------------------------------------------------------------------------- device helpers


def _weight_kn(w: Tensor, transpose_weight: bool) -> Tensor:
    """``w`` as a logical ``[k, n]`` matrix in a layout MC2 reads: ND or a transposed ND view."""
    kn = w.t() if transpose_weight else w
    if kn.is_contiguous() or kn.t().is_contiguous():
        return kn
    return kn.contiguous()


def _hccl_comm_name(group: ProcessGroup) -> str:
    """The HCCL communicator name MC2 needs; torch_npu keys it by global rank."""
    global_rank = dist.get_global_rank(group, group.rank())
    hccl = group._get_backend(_npu_device())  # torch_npu's ProcessGroupHCCL
    return hccl.get_hccl_comm_name(global_rank)  # type: ignore[attr-defined]


def _add_bias(out: Tensor, bias: Tensor | None) -> Tensor:
    """Once, after the kernel, in the output dtype."""
    return out if bias is None else out.add_(bias)
