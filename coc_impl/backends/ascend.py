"""Ascend backend of the fused CoC ops: torch_npu's MC2 kernels over HCCL.

This is the only module of the project that imports ``torch_npu``, and it does
so lazily (:func:`load`), so importing it on a machine without an NPU is cheap
and has no side effects.  :func:`run` takes a call that
:meth:`coc_impl.validated_call.ValidatedCall.validate` has already checked;
:func:`check` adds what the MC2 kernels document, from the arguments, the TP
size, the SoC and this process's earlier MC2 calls only, so every rank of a
group raises the same error, before any collective.  ``backend="auto"`` asks
:func:`check` and runs the portable backend for any call it refuses.

Binding (torch_npu 2.13.0, ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``,
the same lines as Ascend/op-plugin's ``op_plugin/config/op_plugin_functions.yaml``):

=======================  ==============================================
op                       kernel, called as ``torch.ops.npu.<kernel>``
=======================  ==============================================
matmul_all_reduce        ``npu_mm_all_reduce_base(x1, x2, hcom, *, ...)``
matmul_reduce_scatter    ``npu_mm_reduce_scatter_base(self, x2, hcom, world_size, *, ...)``
all_gather_matmul(_v2)   ``npu_all_gather_base_mm(self, x2, hcom, world_size, *, gather_output=...)``
=======================  ==============================================

The kernels are reached through ``torch.ops.npu``, resolved at call time, never
as ``torch_npu.<kernel>``: importing ``torch_npu.onnx`` replaces those
attributes with positional wrappers.  The probe reads the schema the installed
release registered (``torch.ops.npu.<kernel>.default._schema``), so a release
without an argument the binding passes is reported, not called: without the
antiquant arguments (early releases) w8A16 calls are refused, the rest run.

Documented limits (:data:`LIMITS`; a call outside them raises
:class:`CoCBackendUnavailable` naming the limit and its CANN page):

* SoC (``torch_npu.npu.get_soc_version()``, :data:`SOC_FAMILIES`): all-gather
  and reduce-scatter on Atlas A2 and A3; all-reduce, plain and w8A16, on
  Atlas A2 only (aclnnMatmulAllReduce, aclnnWeightQuantMatmulAllReduce).
* TP size: all-reduce 1, 2, 4 or 8 (A2); reduce-scatter and all-gather 2, 4
  or 8 on A2, 2, 4, 8, 16 or 32 on A3 (``world_size`` of
  ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_mm_reduce_scatter_base.md`` and
  ``torch_npu-npu_all_gather_base_mm.md``, Ascend/op-plugin 517f2e7d, as on every
  release branch 7.1.0 to 26.1.0; the kernels' own argument check,
  ``op_plugin/ops/opapi/MatmulReduceScatterBaseKernelNpuOpApi.cpp``, takes the same).
* ``k``: ``256 <= k < 65535`` for reduce-scatter and all-gather; ``k, n <=
  65535`` for w8A16.
* One communication domain: on Atlas A2 every MC2 op of a process must use the
  same HCCL communicator; the group of the first MC2 call is kept while it
  lives, another group is refused (``backend="portable"`` runs it); once that
  group is destroyed, the next MC2 call's group takes its place.
* Activations float16 or bfloat16 on an NPU device
  (:class:`CoCArgumentError`, also before the runtime is asked for).

Operands:

* Weights: MC2 reads ``x2`` as a logical ``[k, n]`` matrix, stored either ND or
  as the transposed view of an ND ``[n, k]`` tensor.  ``transpose_weight=True``
  is honoured by passing ``w.t()`` (a view, no copy); transposition is never
  inferred from shapes, which is ambiguous for square weights.
* w8A16: ``antiquant_scale`` / ``antiquant_offset`` / ``antiquant_group_size``
  go to ``npu_mm_all_reduce_base``, whose dequantisation ``(x2 + offset) *
  scale`` is the spec's.  The kernel reads a per-group scale and offset with
  ``x2``'s transpose flag, so when ``x2`` is a transposed view they are passed
  as the transposed view of an ND ``[n, ceil(k/g)]`` tensor too.
* Bias: the kernels' documented formula is ``reduce(x1 @ x2 + bias)``, i.e. a
  bias handed to them is added on every rank before the reduction (``tp``
  times), and the all-gather / reduce-scatter kernels reject a non-zero bias.
  Bias is therefore never given to MC2; it is added once to the result.
* Communicator: MC2 names the HCCL communicator by string, taken from the
  group's HCCL backend with ``get_hccl_comm_name(global_rank)``.

Determinism: CANN documents ``HCCL_DETERMINISTIC`` for MatmulAllReduce as well
as for HCCL's collectives; it makes a kernel's reduction reproducible from run
to run, in an order of the kernel's choosing and in the output dtype -- what
the protocol's ``deterministic=True`` asks.  This implementation defines one
result (:mod:`coc_impl.deterministic`: float32 partials summed in ascending
rank order, bias in float32, one cast), the same bits as the portable backend
on any device whose GEMM agrees, and no MC2 switch yields that order.  So
``deterministic=True`` does not use MC2: it runs the portable pipeline
(:mod:`coc_impl.backends.portable`) on the NPU over HCCL, whose reducer moves
the float32 partials by pure data movement (all-gather / all-to-all, bit
exact) and sums them locally in rank order -- the definition itself, still
overlapped block by block, just not fused.  The per-rank matmul is
reproducible only under ``torch.use_deterministic_algorithms(True)`` (set once
at rank start-up, before the first NPU op); without it the op raises
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
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    "LIMITS",
    "MC2_OPS",
    "SOC_FAMILIES",
    "VISIBLE_DEVICES_ENV",
    "W8A16_DOC",
    "W8A16_MAX_KN",
    "KernelLimits",
    "bind_device",
    "check",
    "init_process_group_kwargs",
    "is_available",
    "load",
    "registered_schema",
    "run",
    "soc_family",
    "unavailable_reason",
    "visible_devices_env",
]

#: Read by the Ascend runtime when it starts: the physical devices a process sees.
VISIBLE_DEVICES_ENV = "ASCEND_RT_VISIBLE_DEVICES"
#: The torch_npu kernels this backend binds to.
MC2_OPS = ("npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base", "npu_all_gather_base_mm")
#: Product lines by ``torch_npu.npu.get_soc_version()`` code (torch_npu's ``c10_npu::SocVersion``).
SOC_FAMILIES: Mapping[str, range] = {"Atlas A2": range(220, 226), "Atlas A3": range(250, 257)}


@dataclass(frozen=True)
class KernelLimits:
    """What one MC2 kernel takes, as its CANN page documents it."""

    kernel: str
    #: The CANN page the limits come from.
    doc: str
    #: TP sizes per SoC family; a family not listed is not supported.
    tp: Mapping[str, frozenset[int]]
    #: ``[lo, hi)`` of ``k``, where documented.
    k_range: tuple[int, int] | None = None
    #: Families on which every MC2 op of a process must use one communication domain.
    one_domain: frozenset[str] = frozenset({"Atlas A2"})


_GATHER_SCATTER_TP = {"Atlas A2": frozenset({2, 4, 8}), "Atlas A3": frozenset({2, 4, 8, 16, 32})}
#: The documented limits, by fused op.
LIMITS: Mapping[str, KernelLimits] = {
    "matmul_all_reduce": KernelLimits(
        "npu_mm_all_reduce_base", "CANN aclnnMatmulAllReduce", {"Atlas A2": frozenset({1, 2, 4, 8})}
    ),
    "matmul_reduce_scatter": KernelLimits(
        "npu_mm_reduce_scatter_base", "CANN aclnnMatmulReduceScatter", _GATHER_SCATTER_TP, (256, 65535)
    ),
    "all_gather_matmul": KernelLimits(
        "npu_all_gather_base_mm", "CANN aclnnAllGatherMatmul", _GATHER_SCATTER_TP, (256, 65535)
    ),
    "all_gather_matmul_v2": KernelLimits(
        "npu_all_gather_base_mm", "CANN aclnnAllGatherMatmul", _GATHER_SCATTER_TP, (256, 65535)
    ),
}
#: w8A16 all-reduce: the plain one's SoC and TP sizes, and ``k, n <= W8A16_MAX_KN`` (:data:`W8A16_DOC`).
W8A16_DOC = "CANN aclnnWeightQuantMatmulAllReduce"
W8A16_MAX_KN = 65535

#: Activation dtypes of the MC2 kernels (int8 only for their fully quantised modes).
_MC2_DTYPES = (torch.float16, torch.bfloat16)
#: Keyword arguments the binding passes to each kernel on every call.
_KEYWORDS = {
    "npu_mm_all_reduce_base": ("reduce_op", "comm_turn"),
    "npu_mm_reduce_scatter_base": ("reduce_op", "comm_turn"),
    "npu_all_gather_base_mm": ("gather_index", "gather_output", "comm_turn"),
}


# --------------------------------------------------------------------------- runtime


@dataclass(frozen=True)
class _Runtime:
    """What the probe found: the module, the SoC, the argument names each kernel's schema has."""

    module: ModuleType
    soc: int
    arguments: Mapping[str, frozenset[str]]


def registered_schema(kernel: str) -> Any:
    """The schema the installed release registered for ``kernel`` (``torch.ops.npu.<kernel>.default``), or None."""
    try:
        return getattr(torch.ops.npu, kernel).default._schema
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def _probe() -> tuple[_Runtime | None, str | None]:
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
    version = getattr(torch_npu, "__version__", "?")
    schemas = {name: registered_schema(name) for name in MC2_OPS}
    missing = [name for name, schema in schemas.items() if schema is None]
    if missing:
        return None, (
            f"torch_npu {version} registers no MC2 ops {', '.join(missing)} under torch.ops.npu "
            "(they need torch_npu / CANN 8.0.RC2 or later)"
        )
    arguments = {name: frozenset(arg.name for arg in schema.arguments) for name, schema in schemas.items()}
    for name, keywords in _KEYWORDS.items():
        lacking = [kw for kw in keywords if kw not in arguments[name]]
        if lacking:
            return None, f"torch_npu {version}'s {name} takes no {', '.join(lacking)}: {schemas[name]}"
    try:
        soc = int(torch_npu.npu.get_soc_version())
    except Exception as exc:
        return None, f"torch_npu {version} cannot say the SoC: {type(exc).__name__}: {exc}"
    return _Runtime(torch_npu, soc, arguments), None


def _runtime() -> _Runtime:
    runtime, reason = _probe()
    if runtime is None:
        raise CoCBackendUnavailable(f"Ascend backend unavailable: {reason}")
    return runtime


def load() -> ModuleType:
    """The ``torch_npu`` module, or :class:`CoCBackendUnavailable` with the reason."""
    return _runtime().module


def is_available() -> bool:
    """True when torch_npu imports, an NPU is visible and the MC2 ops are registered."""
    return _probe()[0] is not None


def unavailable_reason() -> str | None:
    """Why :func:`is_available` is False (None when it is True)."""
    return _probe()[1]


def soc_family(soc: int) -> str | None:
    """The product line of a ``get_soc_version()`` code, or None for one the MC2 pages do not list."""
    return next((family for family, codes in SOC_FAMILIES.items() if soc in codes), None)


def _npu_device(index: int | None = None) -> torch.device:
    """The NPU device; the ``npu`` type exists only once torch_npu is imported."""
    return torch.device("npu", index) if index is not None else torch.device("npu")


# --------------------------------------------------------------------------- rank set-up


def visible_devices_env(device_ids: Sequence[int]) -> dict[str, str]:
    """Environment that binds a rank to ``device_ids``.

    It must be in the rank's environment before torch_npu starts the runtime
    (set it when launching the process); the rank then sees the devices as
    local indices ``0..len(device_ids)-1``.  CANN takes ascending lists only.
    """
    ids = list(device_ids)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or i < 0]
    if not ids or bad or ids != sorted(set(ids)):
        raise CoCArgumentError(f"device_ids must be distinct non-negative ints in ascending order (CANN takes no "
                               f"other {VISIBLE_DEVICES_ENV}), got {ids!r}")
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


def check(call: ValidatedCall) -> None:
    """Raise the declared error if the MC2 binding cannot take ``call`` here.

    Float16/bfloat16 is checked first, on the host (:class:`CoCArgumentError`);
    then the runtime, the device, the determinism requirement and the documented
    limits (:class:`CoCBackendUnavailable`, naming the limit and its source).
    """
    op = call.op
    if call.x.dtype not in _MC2_DTYPES:
        raise CoCArgumentError(f"{op}: x must be float16 or bfloat16 on Ascend, got {call.x.dtype}")
    runtime = _runtime()
    if call.x.device.type != _npu_device().type:
        raise CoCArgumentError(f"{op}: the Ascend backend takes NPU tensors, x is on {call.x.device}")
    if call.deterministic:
        _require_deterministic_algorithms(op)
        return
    _check_kernel_limits(call, runtime)


def run(call: ValidatedCall) -> Tensor | tuple[Tensor, Tensor]:
    """One validated call on the MC2 kernels (``deterministic=True``: the portable pipeline)."""
    check(call)
    if call.deterministic:
        return portable.run(call)
    _claim_domain(call, _runtime())
    x1, x2, hcom = call.x.contiguous(), _weight_kn(call), _hccl_comm_name(call.group)
    npu = torch.ops.npu  # resolved now: torch_npu.<kernel> may be an onnx wrapper
    op = call.op
    if op == "matmul_all_reduce":
        out = npu.npu_mm_all_reduce_base(x1, x2, hcom, reduce_op="sum", comm_turn=0, **_antiquant_kwargs(call, x2))
        return call.add_bias(out)
    if op == "matmul_reduce_scatter":
        out = npu.npu_mm_reduce_scatter_base(x1, x2, hcom, call.tp, reduce_op="sum", comm_turn=0)
        return call.add_bias(out)
    gather_output = op == "all_gather_matmul_v2"
    out, gathered = npu.npu_all_gather_base_mm(
        x1, x2, hcom, call.tp, gather_index=0, gather_output=gather_output, comm_turn=0
    )
    return (call.add_bias(out), gathered) if gather_output else call.add_bias(out)


def _antiquant_kwargs(call: ValidatedCall, x2: Tensor) -> dict[str, Any]:
    """w8A16 arguments of ``npu_mm_all_reduce_base``; only what is set, so releases without per-group still bind.

    A per-group scale (and offset) is read with ``x2``'s transpose flag, so it
    takes ``x2``'s layout: a transposed view of an ND ``[n, ceil(k/g)]`` tensor
    when ``x2`` is one of ``[n, k]``.
    """
    aq = call.antiquant
    if aq is None:
        return {}
    transposed = aq.granularity == "group" and not x2.is_contiguous()

    def layout(t: Tensor) -> Tensor:
        return t.t().contiguous().t() if transposed else t.contiguous()

    kwargs: dict[str, Any] = {"antiquant_scale": layout(aq.scale)}
    if aq.offset is not None:
        kwargs["antiquant_offset"] = layout(aq.offset)
    if aq.group_size:
        kwargs["antiquant_group_size"] = aq.group_size
    return kwargs


# --------------------------------------------------------------------------- checks

@dataclass(frozen=True)
class _Domain:
    """The group whose communicator this process's MC2 calls use, where the SoC allows one communication domain.

    The rule is about live communicators: once the group is destroyed, the next MC2 call may claim another.
    Destroying a group drops it from torch's registry of groups (``distributed_c10d._world.pg_map``), though
    torch or the caller may keep the object; a group that was never registered there (one built directly)
    lives as long as the object.
    """

    group: weakref.ref[ProcessGroup]
    registered: bool

    @classmethod
    def of(cls, group: ProcessGroup) -> _Domain:
        return cls(weakref.ref(group), _registered(group))

    def live_group(self) -> ProcessGroup | None:
        """The group, while it still holds its communicator; None once it is destroyed."""
        group = self.group()
        if group is None or (self.registered and not _registered(group)):
            return None
        return group


def _registered(group: ProcessGroup) -> bool:
    """Whether torch.distributed lists ``group`` as a live group."""
    try:
        from torch.distributed.distributed_c10d import _world

        return group in _world.pg_map
    except (ImportError, AttributeError, TypeError):  # a torch without the registry: the object's life decides
        return False


#: This process's communication domain for MC2, where the SoC allows one (:class:`_Domain`).
_domain: _Domain | None = None


def _domain_group() -> ProcessGroup | None:
    """The live group of this process's MC2 domain, if one is claimed (a destroyed one is released)."""
    global _domain
    group = _domain.live_group() if _domain is not None else None
    if group is None:
        _domain = None
    return group


def _check_kernel_limits(call: ValidatedCall, runtime: _Runtime) -> None:
    """Calls the MC2 kernels do not take are reported, never sent (``backend="portable"`` takes them)."""
    limits = LIMITS[call.op]
    family = soc_family(runtime.soc)
    sizes = limits.tp.get(family) if family is not None else None
    if family is None or sizes is None:
        where = f"{family} (SoC {runtime.soc})" if family else f"SoC {runtime.soc}"
        raise CoCBackendUnavailable(
            f"{call.op}: {limits.kernel} is documented for {' and '.join(limits.tp)} only "
            f"({limits.doc}); this NPU is {where}"
        )
    if call.tp not in sizes:
        raise CoCBackendUnavailable(
            f"{call.op}: {limits.kernel} takes a TP size in {sorted(sizes)} on {family} ({limits.doc}), "
            f"got tp={call.tp}"
        )
    if limits.k_range is not None:
        lo, hi = limits.k_range
        if not lo <= call.k < hi:
            raise CoCBackendUnavailable(
                f"{call.op}: {limits.kernel} needs {lo} <= k < {hi} ({limits.doc}), got k={call.k}"
            )
    if call.antiquant is not None:
        _check_antiquant(call, runtime)
    held = _domain_group() if family in limits.one_domain else None
    if held is not None and held is not call.group:
        raise CoCBackendUnavailable(
            f"{call.op}: on {family} every MC2 op of a process must use one communication domain "
            f"({limits.doc}); this process's MC2 ops already run on another live group than this one "
            f"(tp={call.tp}); backend='portable' runs it"
        )


def _check_antiquant(call: ValidatedCall, runtime: _Runtime) -> None:
    """w8A16: the installed release must take the arguments, the sizes must be in range."""
    aq = call.antiquant
    assert aq is not None
    wanted = ["antiquant_scale"]
    wanted += ["antiquant_offset"] if aq.offset is not None else []
    wanted += ["antiquant_group_size"] if aq.group_size else []
    lacking = [name for name in wanted if name not in runtime.arguments["npu_mm_all_reduce_base"]]
    if lacking:
        raise CoCBackendUnavailable(
            f"{call.op}: the installed torch_npu's npu_mm_all_reduce_base takes no {', '.join(lacking)} "
            f"(its registered schema), which w8A16 per-{aq.granularity} needs"
        )
    if max(call.k, call.n) > W8A16_MAX_KN:
        raise CoCBackendUnavailable(
            f"{call.op}: the MC2 w8A16 kernel needs k, n <= {W8A16_MAX_KN} ({W8A16_DOC}), "
            f"got k={call.k}, n={call.n}"
        )


def _claim_domain(call: ValidatedCall, runtime: _Runtime) -> None:
    """Keep the MC2 call's group where the SoC allows one communication domain per process and none is live."""
    global _domain
    family = soc_family(runtime.soc)
    if family in LIMITS[call.op].one_domain and _domain_group() is None:
        _domain = _Domain.of(call.group)


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
