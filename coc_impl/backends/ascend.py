"""Ascend backend of the fused CoC ops: torch_npu's MC2 kernels over HCCL.

This is the only module of the project that imports ``torch_npu``, and it does
so lazily (:func:`load`), so importing it on a machine without an NPU is cheap
and has no side effects.  :func:`run` takes a call whose arguments
:meth:`coc_impl.validated_call.ValidatedCall.validate` has already checked, and checks only
what the MC2 kernels add: float16/bfloat16 activations on the host
(:class:`CoCArgumentError`), then the runtime, the determinism requirement and
the kernels' size limits (:class:`CoCBackendUnavailable`, carrying the reason),
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
from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable

if TYPE_CHECKING:
    from torch import Tensor
    from torch.distributed import ProcessGroup

    from coc_impl.validated_call import ValidatedCall

__all__ = [
    "MC2_OPS",
    "VISIBLE_DEVICES_ENV",
    "bind_device",
    "init_process_group_kwargs",
    "is_available",
    "load",
    "run",
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


def run(call: ValidatedCall) -> Tensor | tuple[Tensor, Tensor]:
    """One call validated by :meth:`coc_impl.validated_call.ValidatedCall.validate`, on the MC2 kernels."""
    op = call.op
    if call.x.dtype not in _MC2_DTYPES:
        raise CoCArgumentError(f"{op}: x must be float16 or bfloat16 on Ascend, got {call.x.dtype}")
    npu = load()
    if call.deterministic:
        _require_deterministic_algorithms(op)
        return portable.run(call)
    _check_kernel_limits(call)
    x1, x2, hcom = call.x.contiguous(), _weight_kn(call), _hccl_comm_name(call.group)
    if op == "matmul_all_reduce":
        out = npu.npu_mm_all_reduce_base(x1, x2, hcom, reduce_op="sum", comm_turn=0, **_antiquant_kwargs(call))
        return call.add_bias(out)
    if op == "matmul_reduce_scatter":
        out = npu.npu_mm_reduce_scatter_base(x1, x2, hcom, call.tp, reduce_op="sum", comm_turn=0)
        return call.add_bias(out)
    gather_output = op == "all_gather_matmul_v2"
    out, gathered = npu.npu_all_gather_base_mm(
        x1, x2, hcom, call.tp, gather_index=0, gather_output=gather_output, comm_turn=0
    )
    return (call.add_bias(out), gathered) if gather_output else call.add_bias(out)


def _antiquant_kwargs(call: ValidatedCall) -> dict[str, Any]:
    """w8A16 arguments of ``npu_mm_all_reduce_base``; only what is set, so releases without per-group still bind."""
    aq = call.antiquant
    if aq is None:
        return {}
    kwargs: dict[str, Any] = {"antiquant_scale": aq.scale}
    if aq.offset is not None:
        kwargs["antiquant_offset"] = aq.offset
    if aq.group_size:
        kwargs["antiquant_group_size"] = aq.group_size
    return kwargs


# --------------------------------------------------------------------------- checks


def _check_kernel_limits(call: ValidatedCall) -> None:
    """Sizes the MC2 kernels do not take are reported, never sent (``backend="portable"`` takes them)."""
    if call.op != "matmul_all_reduce":
        lo, hi = _MC2_GATHER_SCATTER_K
        if not lo <= call.k < hi:
            raise CoCBackendUnavailable(f"{call.op}: the MC2 kernel needs {lo} <= k < {hi}, got k={call.k}")
    elif call.antiquant is not None and max(call.k, call.n) > _MC2_ANTIQUANT_MAX:
        raise CoCBackendUnavailable(
            f"{call.op}: the MC2 w8A16 kernel needs k, n <= {_MC2_ANTIQUANT_MAX}, got k={call.k}, n={call.n}"
        )


def _require_deterministic_algorithms(op: str) -> None:
    if not torch.are_deterministic_algorithms_enabled():
        raise CoCBackendUnavailable(
            f"{op}(deterministic=True) on Ascend needs torch.use_deterministic_algorithms(True), "
            "set once at rank start-up before the first NPU op, so the per-rank matmul is reproducible"
        )


# --------------------------------------------------------------------------- device helpers


def _weight_kn(call: ValidatedCall) -> Tensor:
    """``w`` as a logical ``[k, n]`` matrix in a layout MC2 reads: ND or a transposed ND view."""
    kn = call.w.t() if call.transpose_weight else call.w
    if kn.is_contiguous() or kn.t().is_contiguous():
        return kn
    return kn.contiguous()


def _hccl_comm_name(group: ProcessGroup) -> str:
    """The HCCL communicator name MC2 needs; torch_npu keys it by global rank."""
    global_rank = dist.get_global_rank(group, group.rank())
    hccl = group._get_backend(_npu_device())  # torch_npu's ProcessGroupHCCL
    return hccl.get_hccl_comm_name(global_rank)  # type: ignore[attr-defined]
