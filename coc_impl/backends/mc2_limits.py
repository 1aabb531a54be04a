"""What the MC2 kernels take, as CANN documents it, and the check that refuses the rest before any collective.

The check reads the arguments, the TP size, the SoC and this process's earlier
MC2 calls only, so every rank of a group raises the same error.  A call outside
the limits raises :class:`CoCBackendUnavailable` naming the limit and its CANN
page (``backend="portable"`` runs it):

* SoC (``torch_npu.npu.get_soc_version()``, :data:`~coc_impl.backends.npu_runtime.SOC_FAMILIES`):
  all-gather and reduce-scatter on Atlas A2 and A3; all-reduce, plain and w8A16, on
  Atlas A2 only (aclnnMatmulAllReduce, aclnnWeightQuantMatmulAllReduce).
* TP size: all-reduce 1, 2, 4 or 8 (A2); reduce-scatter and all-gather 2, 4
  or 8 on A2, 2, 4, 8, 16 or 32 on A3 (``world_size`` of
  ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_mm_reduce_scatter_base.md`` and
  ``torch_npu-npu_all_gather_base_mm.md``, Ascend/op-plugin 517f2e7d, as on every
  release branch 7.1.0 to 26.1.0; the kernels' own argument check,
  ``op_plugin/ops/opapi/MatmulReduceScatterBaseKernelNpuOpApi.cpp``, takes the same).
* ``k``: ``256 <= k < 65535`` for reduce-scatter and all-gather; ``k, n <=
  65535`` for w8A16, whose arguments the installed release must register (without
  the antiquant arguments, early releases, w8A16 calls are refused, the rest run).
* One communication domain: on Atlas A2 every MC2 op of a process must use the
  same HCCL communicator; the group of the first MC2 call is kept while it
  lives, another group is refused; once that group is destroyed, the next MC2
  call's group takes its place (:func:`claim_domain`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coc_impl.backends.npu_runtime import Runtime, soc_family
from coc_impl.errors import CoCBackendUnavailable

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from coc_impl.validated_call import ValidatedCall

__all__ = ["LIMITS", "W8A16_DOC", "W8A16_MAX_KN", "KernelLimits", "check_limits", "claim_domain"]


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


# --------------------------------------------------------------------------- one communication domain


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


def claim_domain(call: ValidatedCall, runtime: Runtime) -> None:
    """Keep the MC2 call's group where the SoC allows one communication domain per process and none is live."""
    global _domain
    family = soc_family(runtime.soc)
    if family in LIMITS[call.op].one_domain and _domain_group() is None:
        _domain = _Domain.of(call.group)


# --------------------------------------------------------------------------- checks


def check_limits(call: ValidatedCall, runtime: Runtime) -> None:
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


def _check_antiquant(call: ValidatedCall, runtime: Runtime) -> None:
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
