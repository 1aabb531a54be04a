"""torch_npu's MC2 kernels on the emulated device: the documented formula, the documented refusals.

The three kernels are defined with ``torch.library`` under ``torch.ops.npu`` with the exact schemas of the
contract (:mod:`npu_sim.contract`), so torch's own argument parser checks every call as torch_npu's
registration would.  On npu tensors each computes what its torch_npu page documents, over the
communicator named by ``hcom`` (:func:`npu_sim.hccl.communicator_named`):

* ``npu_mm_all_reduce_base`` (torch_npu "torch_npu.npu_mm_all_reduce_base", CANN "aclnnMatmulAllReduce",
  "aclnnWeightQuantMatmulAllReduce"): ``allreduce(x1 @ ((x2 + antiquant_offset) * antiquant_scale) + bias
  + x3)``.  Every rank adds ``bias`` (and ``x3``) to its own product before the reduction, so a bias
  counts ``tp`` times.  w8A16 scales are per tensor ``[1]``, per channel ``[n]`` / ``[1, n]`` or per group
  ``[ceil(k / g), n]``; a per-group scale is read with ``x2``'s transpose flag: with a transposed ``x2`` the
  kernel reads it as the transposed view of an ND ``[n, ceil(k / g)]`` tensor.
* ``npu_mm_reduce_scatter_base`` (CANN "aclnnMatmulReduceScatter"): this rank's ``m / tp`` rows of
  ``reducescatter(x1 @ x2)``.
* ``npu_all_gather_base_mm`` (CANN "aclnnAllGatherMatmul"): ``allgather(x1) @ x2``, ``x1`` gathered
  rank-major, with the gathered ``x1`` as second output (``gather_output``) or an empty tensor.

Each local product is the device GEMM (:mod:`npu_sim.gemm`) rounded once to the activation dtype, and the
reductions are HCCL's (:mod:`npu_sim.reductions`: arrival order unless ``HCCL_DETERMINISTIC``).  ``x2`` is
read as the kernel reads its layout: an ND ``[k, n]`` matrix or the transposed view of an ND ``[n, k]``
tensor, so a transposed weight handed over as a contiguous copy is a different matrix; any other layout is
refused.

Refused with :class:`Mc2Refused`, naming the CANN page, as the pages rule out: a SoC the kernel is not
documented for, TP sizes per product line, ``k`` outside ``[256, 65535)`` (reduce-scatter, all-gather),
``m`` not a multiple of ``tp`` (reduce-scatter), dtypes other than float16 / bfloat16, a bias where only a
null one is supported, ``reduce_op`` other than ``sum``, ``comm_turn`` or ``gather_index`` other than 0,
and, on Atlas A2, a second communication domain: "a model's fused compute-communication operators
(AllGatherMatmul, MatmulReduceScatter, MatmulAllReduce) support only the same communication domain" --
the first MC2 call's communicator is this process's until it is destroyed.  The fully quantised modes
are not modelled (:class:`NotImplementedError`).

:func:`calls` counts the calls each kernel ran in this process.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter
from typing import Any

import torch

from npu_sim import collectives, contract, gemm, hccl, runtime, soc
from npu_sim.tensor import NpuTensor, wrap

ALL_REDUCE = "npu_mm_all_reduce_base"
REDUCE_SCATTER = "npu_mm_reduce_scatter_base"
ALL_GATHER = "npu_all_gather_base_mm"
#: Arguments of the quantised modes, which the emulator does not model (they must keep their defaults).
_QUANTISED = {
    ALL_REDUCE: ("dequant_scale", "pertoken_scale", "comm_quant_scale_1", "comm_quant_scale_2", "group_sizes",
                 "y_dtype", "x1_dtype", "x2_dtype", "dequant_scale_dtype", "pertoken_scale_dtype"),
    REDUCE_SCATTER: ("x1_scale", "x2_scale", "output_dtype"),
    ALL_GATHER: ("x1_scale", "x2_scale", "output_dtype"),
}


class Mc2Refused(RuntimeError):
    """An MC2 kernel refused a call its CANN page rules out."""


_CALLS: Counter[str] = Counter()
_STATE_LOCK = threading.Lock()
#: The communicator of this process's MC2 calls, on a product line with one communication domain per process.
_DOMAIN: list[str] = []


def calls() -> dict[str, int]:
    """How many calls each MC2 kernel ran in this process (refused calls are not counted)."""
    with _STATE_LOCK:
        return {kernel: _CALLS[kernel] for kernel in contract.SCHEMAS}


def _refuse(kernel: str, what: str, doc: str | None = None) -> Mc2Refused:
    return Mc2Refused(f"{kernel}: {what} ({doc or contract.LIMITS[kernel]['doc']})")


def _forget_domain(communicator: hccl.Communicator) -> None:
    with _STATE_LOCK:
        if _DOMAIN and _DOMAIN[0] == communicator.name:
            _DOMAIN.clear()


# --------------------------------------------------------------------------- checks


def _bind(schema, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = {arg.name: arg.default_value for arg in schema.arguments}
    bound.update(zip((arg.name for arg in schema.arguments), args))
    bound.update(kwargs)
    return bound


def _raw(kernel: str, name: str, value: Any) -> torch.Tensor | None:
    if value is None:
        return None
    if type(value) is not NpuTensor:
        raise RuntimeError(f"{kernel}: {name} must be an npu tensor, got one on {value.device}")
    return value.raw


def _checked(kernel: str, bound: dict[str, Any]) -> tuple[hccl.Communicator, str, bool]:
    """The checks every MC2 kernel shares; returns the communicator, the product line and x2's transpose flag."""
    limits = contract.LIMITS[kernel]
    runtime.start()
    family = soc.family(runtime.STATE.soc_code)
    if family not in limits["tp"]:
        raise _refuse(kernel, f"documented for {' and '.join(limits['tp'])} only, not "
                              f"{runtime.STATE.soc_name} ({family or 'another product line'})")
    hcom = bound["hcom"]
    communicator = hccl.communicator_named(hcom)
    if communicator is None:
        raise _refuse(kernel, f"no live HCCL communicator is named {hcom!r} (get_hccl_comm_name gives it)")
    tp = communicator.backend.group_size
    if bound.get("world_size", tp) != tp:
        raise _refuse(kernel, f"world_size={bound['world_size']} but the communication domain has {tp} ranks")
    if tp not in limits["tp"][family]:
        raise _refuse(kernel, f"TP sizes {limits['tp'][family]} on {family}, got {tp}")
    x1, x2 = bound["x1"] if "x1" in bound else bound["self"], bound["x2"]
    if str(x1.dtype).removeprefix("torch.") not in limits["dtypes"]:
        raise _refuse(kernel, f"x1 must be {' or '.join(limits['dtypes'])}, got {x1.dtype}")
    if x1.dim() not in ((2, 3) if kernel == ALL_REDUCE else (2,)) or not x1.is_contiguous():
        raise _refuse(kernel, f"x1 must be an ND (contiguous) {'2-D or 3-D' if kernel == ALL_REDUCE else '2-D'} "
                              f"tensor, got shape {list(x1.shape)} strides {list(x1.stride())}")
    transposed = x2.dim() == 2 and not x2.is_contiguous() and x2.t().is_contiguous()
    if x2.dim() != 2 or not (x2.is_contiguous() or transposed):
        raise _refuse(kernel, f"x2 must be a 2-D ND tensor or the transposed view of one, got shape "
                              f"{list(x2.shape)} strides {list(x2.stride())}")
    k = x1.shape[-1]
    if x2.shape[0] != k:
        raise _refuse(kernel, f"x1 {list(x1.shape)} and x2 {list(x2.shape)} do not multiply")
    if "k" in limits and not limits["k"][0] <= k < limits["k"][1]:
        raise _refuse(kernel, f"{limits['k'][0]} <= k < {limits['k'][1]}, got k={k}")
    if limits.get("m_multiple_of_tp") and x1.shape[0] % tp:
        raise _refuse(kernel, f"m={x1.shape[0]} must be a multiple of world_size={tp}")
    bias = bound["bias"]
    if bias is not None:
        if limits["bias"] == "none":
            raise _refuse(kernel, "a bias is not supported (the page supports a null bias only)")
        if bias.dim() != 1 or bias.shape[0] != x2.shape[1] or bias.dtype != x1.dtype:
            raise _refuse(kernel, f"bias must be 1-D [n={x2.shape[1]}] of x1's dtype, got {list(bias.shape)} "
                                  f"{bias.dtype}")
    if bound.get("reduce_op", "sum") != "sum":
        raise _refuse(kernel, f"reduce_op must be 'sum', got {bound['reduce_op']!r}")
    if bound["comm_turn"] != 0 or bound.get("gather_index", 0) != 0:
        raise _refuse(kernel, "comm_turn and gather_index must be 0")
    quantised = [name for name in _QUANTISED[kernel] if bound.get(name) is not None]
    if quantised or bound.get("comm_quant_mode", 0) or bound.get("comm_mode") not in (None, "ai_cpu"):
        raise NotImplementedError(f"npu-sim does not model {kernel}'s quantised or aiv modes "
                                  f"({', '.join(quantised) or 'comm_quant_mode / comm_mode'})")
    if family in limits["one_domain"]:
        with _STATE_LOCK:
            if _DOMAIN and _DOMAIN[0] != hcom:
                raise _refuse(kernel, f"on {family} a process's MC2 operators support only one communication "
                                      f"domain: this process's run on {_DOMAIN[0]!r}, this call on {hcom!r}")
    return communicator, family, transposed


def _claim_domain(kernel: str, family: str, hcom: str) -> None:
    if family in contract.LIMITS[kernel]["one_domain"]:
        with _STATE_LOCK:
            if not _DOMAIN:
                _DOMAIN.append(hcom)


def _antiquant(bound: dict[str, Any], transposed: bool, scale, offset) -> torch.Tensor:
    """``x2`` as the w8A16 kernel multiplies it: ``(x2 + offset) * scale`` in float32, rounded to x1's dtype."""
    kernel, doc = ALL_REDUCE, contract.LIMITS[ALL_REDUCE]["w8a16"]["doc"]
    w8a16 = contract.LIMITS[ALL_REDUCE]["w8a16"]
    x1, x2 = bound["x1"], bound["x2"].raw
    k, n = x2.shape
    group = bound["antiquant_group_size"]
    if scale is None or scale.dtype != x1.dtype:
        raise _refuse(kernel, f"an int8 x2 needs antiquant_scale of x1's dtype {x1.dtype}", doc)
    if offset is not None and (offset.shape != scale.shape or offset.dtype != scale.dtype):
        raise _refuse(kernel, "antiquant_offset must have antiquant_scale's shape and dtype", doc)
    if max(k, n) > w8a16["max_kn"]:
        raise _refuse(kernel, f"k, n <= {w8a16['max_kn']}, got k={k}, n={n}", doc)
    params = [scale] if offset is None else [scale, offset]
    if group:
        align = w8a16["group_size_align"]
        if group % align or not align <= group < k:
            raise _refuse(kernel, f"antiquant_group_size must be a multiple of {align} in [{align}, k-1], got {group}",
                          doc)
        groups = math.ceil(k / group)
        if tuple(scale.shape) != (groups, n):
            raise _refuse(kernel, f"a per-group scale is [ceil(k/g), n] = [{groups}, {n}], got {list(scale.shape)}",
                          doc)
        # The kernel reads the scale's memory in x2's layout: [n, groups] row-major when x2 is transposed.
        layout = ((groups, n), (1, groups)) if transposed else ((groups, n), (n, 1))
        read = [p.as_strided(*layout, p.storage_offset()).float().repeat_interleave(group, dim=0)[:k] for p in params]
    else:
        if tuple(scale.shape) not in ((1,), (n,), (1, n)):
            raise _refuse(kernel, f"antiquant_scale must be [1], [n] or [1, n] (n={n}), got {list(scale.shape)}", doc)
        read = [p.float().reshape(1, -1) for p in params]
    weight = x2.float() + read[1] if offset is not None else x2.float()
    return (weight * read[0]).to(x1.dtype)


# --------------------------------------------------------------------------- kernels


def _all_reduce(bound: dict[str, Any]) -> torch.Tensor:
    communicator, family, transposed = _checked(ALL_REDUCE, bound)
    x1, x2 = bound["x1"].raw, bound["x2"].raw
    scale, offset = _raw(ALL_REDUCE, "antiquant_scale", bound["antiquant_scale"]), _raw(
        ALL_REDUCE, "antiquant_offset", bound["antiquant_offset"])
    if x2.dtype == torch.int8:
        weight = _antiquant(bound, transposed, scale, offset)
    elif x2.dtype != x1.dtype or scale is not None or offset is not None:
        raise _refuse(ALL_REDUCE, f"x2 must have x1's dtype {x1.dtype} (or be int8 with antiquant_scale), got "
                                  f"{x2.dtype}")
    else:
        weight = x2
    bias, x3 = _raw(ALL_REDUCE, "bias", bound["bias"]), _raw(ALL_REDUCE, "x3", bound["x3"])
    n = weight.shape[1]
    out_shape = (*x1.shape[:-1], n)
    if x3 is not None and (tuple(x3.shape) != out_shape or x3.dtype != x1.dtype):
        raise _refuse(ALL_REDUCE, f"x3 must have the output's shape {list(out_shape)} and dtype, got "
                                  f"{list(x3.shape)} {x3.dtype}")
    _claim_domain(ALL_REDUCE, family, communicator.name)
    local = gemm.accumulate(x1.reshape(-1, x1.shape[-1]), weight)
    if bias is not None:
        local += bias.float()
    if x3 is not None:
        local += x3.reshape(-1, n).float()
    total = collectives.reduce_now(communicator.backend, local.to(x1.dtype))
    return wrap(total.reshape(out_shape))


def _reduce_scatter(bound: dict[str, Any]) -> torch.Tensor:
    communicator, family, _ = _checked(REDUCE_SCATTER, bound)
    x1, x2 = bound["self"].raw, bound["x2"].raw
    if x2.dtype != x1.dtype:
        raise _refuse(REDUCE_SCATTER, f"x2 must have x1's dtype {x1.dtype}, got {x2.dtype}")
    _claim_domain(REDUCE_SCATTER, family, communicator.name)
    backend = communicator.backend
    total = collectives.reduce_now(backend, gemm.accumulate(x1, x2).to(x1.dtype))
    rows = x1.shape[0] // backend.group_size
    return wrap(total[backend.group_rank * rows:(backend.group_rank + 1) * rows].clone())


def _all_gather(bound: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    communicator, family, _ = _checked(ALL_GATHER, bound)
    x1, x2 = bound["self"].raw, bound["x2"].raw
    if x2.dtype != x1.dtype:
        raise _refuse(ALL_GATHER, f"x2 must have x1's dtype {x1.dtype}, got {x2.dtype}")
    _claim_domain(ALL_GATHER, family, communicator.name)
    gathered = torch.cat(collectives.gather_now(communicator.backend, x1))
    out = gemm.accumulate(gathered, x2).to(x1.dtype)
    return wrap(out), wrap(gathered if bound["gather_output"] else x1.new_empty(0))


_KERNELS = {ALL_REDUCE: _all_reduce, REDUCE_SCATTER: _reduce_scatter, ALL_GATHER: _all_gather}


def handle(func, args: tuple, kwargs: dict) -> Any:
    """The ``npu`` namespace handler of npu tensors."""
    kernel = func._opname
    compute = _KERNELS.get(kernel)
    if compute is None:
        raise NotImplementedError(f"npu-sim does not model torch.ops.npu.{kernel}")
    bound = _bind(func._schema, args, kwargs)
    for name, value in bound.items():
        if isinstance(value, torch.Tensor):
            _raw(kernel, name, value)
    result = compute(bound)
    with _STATE_LOCK:
        _CALLS[kernel] += 1
    return result


@functools.cache
def install() -> torch.library.Library:
    """Define the kernels under ``torch.ops.npu`` with the contract's schemas (once per process: the cache keeps the
    library, whose definitions live as long as it does)."""
    library = torch.library.Library("npu", "DEF")
    for line in contract.SCHEMAS.values():
        library.define(line)
    hccl.DESTROY_LISTENERS.append(_forget_domain)
    return library
