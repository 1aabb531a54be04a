"""torch_npu's MC2 kernels as their published contract (``npu_sim.contract``), runnable in one CPU process.

The three signatures are defined with ``torch.library``, so torch's own
argument parser checks every call the Ascend binding makes, exactly as
torch_npu's registered ops would: a misnamed, missing or extra positional
argument is refused.  Each CPU kernel then asserts the documented limits (SoC,
TP size, ``k``, ``m % tp``, dtypes, no bias, operand layouts, one live
communication domain on Atlas A2) and computes the documented result from its
inputs, reading a per-group w8A16 scale the way the kernel does (through
``x2``'s transpose flag), so the binding's numbers are checked on a CPU too.

The collective is modelled as ``tp`` ranks holding this rank's inputs:
all-reduce gives ``tp`` times the local product, reduce-scatter this rank's
rows of it, all-gather ``tp`` copies of ``x1``.

The ops live in their own namespace (torch_npu owns ``npu`` on an NPU node);
a test points ``torch.ops.npu`` at :data:`OPS` and installs a
:class:`FakeTorchNpu`, which exposes them as torch_npu does.  Defining is done
once per process, so importing this module twice is harmless.

The contract has one source, the emulated NPU node's (``npu-sim/npu_sim/mc2_contract.toml``): the
emulator's kernels run the same schemas and limits across real HCCL ranks; this stand-in keeps the
single-process model the binding's unit tests need.
"""

from __future__ import annotations

import math
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from npu_sim.contract import CONTRACT as CONTRACT  # re-exported: the tests read the contract through here
from npu_sim.contract import LIMITS, SCHEMAS, SOC_FAMILIES

#: An Atlas A2 SoC (Ascend910B3) and an Atlas A3 one (Ascend910_9391).
A2_SOC, A3_SOC = 223, 250

NAMESPACE = "coc_mc2_stand_in"
#: The first npu_mm_all_reduce_base (Ascend/op-plugin 71ab688d, 2023-11-27): no antiquant arguments.
EARLY_NAMESPACE = "coc_mc2_stand_in_early"
EARLY_ALL_REDUCE = (
    "npu_mm_all_reduce_base(Tensor self, Tensor x2, str hcom, *, str reduce_op='sum', Tensor? bias=None, "
    "int comm_turn=0) -> Tensor"
)


class Refused(RuntimeError):
    """The stand-in kernel refused a call the real one documents as unsupported."""


def _require(ok: bool, kernel: str, what: str) -> None:
    if not ok:
        raise Refused(f"{kernel}: {what} ({LIMITS[kernel]['doc']})")


# --------------------------------------------------------------------------- the fake module


class FakeGroup(dist.ProcessGroup):
    """An HCCL process group as the binding sees it: rank, size and a communicator name.

    Asking for the name registers the communication domain with the installed
    :class:`FakeTorchNpu`, as creating an HCCL communicator would.
    """

    def __init__(self, rank: int = 0, size: int = 4, name: str = "tp"):
        super().__init__(rank, size)
        self.name = name
        self.backend_devices: list = []
        self.comm_name_ranks: list[int] = []

    def _get_backend(self, device):
        self.backend_devices.append(device)
        return types.SimpleNamespace(get_hccl_comm_name=self._comm_name)

    def _comm_name(self, global_rank: int) -> str:
        self.comm_name_ranks.append(global_rank)
        hcom = f"hcom-{self.name}"
        domains = sys.modules["torch_npu"].domains
        domains[hcom] = (self.rank(), self.size())
        weakref.finalize(self, domains.pop, hcom, None)  # a group's communicator dies with it
        return hcom

    def destroy(self) -> None:
        """What ``dist.destroy_process_group(group)`` does: the group leaves torch's registry of groups (the object
        may live on) and its HCCL communicator is destroyed, freeing the process's communication domain."""
        from torch.distributed.distributed_c10d import _world

        _world.pg_map.pop(self, None)
        sys.modules["torch_npu"].domains.pop(f"hcom-{self.name}", None)


class FakeTorchNpu(types.ModuleType):
    """torch_npu on a host with ``devices`` NPUs of SoC ``soc``, its MC2 ops from ``namespace``.

    ``calls`` records every kernel call with all its arguments bound by name.
    """

    def __init__(self, devices: int = 8, soc: int = A2_SOC, namespace: str = NAMESPACE):
        super().__init__("torch_npu")
        self.__version__ = "2.13.0"
        self.soc = soc
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.devices_set: list[int] = []
        self.domains: dict[str, tuple[int, int]] = {}
        self.domain_used: str | None = None
        self.npu = types.SimpleNamespace(
            is_available=lambda: devices > 0,
            device_count=lambda: devices,
            set_device=self.devices_set.append,
            get_soc_version=lambda: self.soc,
        )
        ops = getattr(torch.ops, namespace)
        for kernel in SCHEMAS:
            if hasattr(ops, kernel):
                setattr(self, kernel, getattr(ops, kernel))

    def family(self) -> str | None:
        return next((name for name, codes in SOC_FAMILIES.items() if self.soc in codes), None)


# --------------------------------------------------------------------------- kernels


def _bind(schema: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument by name: the defaults, then what the caller passed (torch drops values equal to them)."""
    bound = {arg.name: arg.default_value for arg in schema.arguments}
    bound.update(zip((arg.name for arg in schema.arguments), args))
    bound.update(kwargs)
    return bound


def _x1(bound: dict[str, Any]) -> torch.Tensor:
    return bound["x1"] if "x1" in bound else bound["self"]


def _common(kernel: str, bound: dict[str, Any], fake: FakeTorchNpu) -> tuple[int, int, bool]:
    """The limits every MC2 kernel shares; returns ``(rank, tp, x2 transposed)``."""
    limits, family = LIMITS[kernel], fake.family()
    _require(family in limits["tp"], kernel, f"documented for {sorted(limits['tp'])}, not SoC {fake.soc}")
    hcom = bound["hcom"]
    _require(hcom in fake.domains, kernel, f"unknown communication domain {hcom!r}")
    rank, tp = fake.domains[hcom]
    _require(bound.get("world_size", tp) == tp, kernel, f"world_size {bound.get('world_size')} != group size {tp}")
    _require(tp in limits["tp"][family], kernel, f"TP sizes {limits['tp'][family]} on {family}, got {tp}")
    if family in limits["one_domain"]:
        live = fake.domain_used in fake.domains  # a destroyed communicator frees the domain
        fake.domain_used = fake.domain_used if live else hcom
        _require(fake.domain_used == hcom, kernel, f"one communication domain on {family}: {fake.domain_used}, {hcom}")
    x1, x2 = _x1(bound), bound["x2"]
    _require(str(x1.dtype).removeprefix("torch.") in limits["dtypes"], kernel, f"x1 dtype {x1.dtype}")
    _require(x1.dim() == 2 and x1.is_contiguous(), kernel, "x1 must be a 2-D ND tensor")
    transposed = not x2.is_contiguous()
    _require(x2.dim() == 2 and (not transposed or x2.t().is_contiguous()), kernel, "x2 must be ND or a transposed ND")
    _require(x1.shape[1] == x2.shape[0], kernel, f"x1 {list(x1.shape)} and x2 {list(x2.shape)} do not multiply")
    if "k" in limits:
        lo, hi = limits["k"]
        _require(lo <= x1.shape[1] < hi, kernel, f"{lo} <= k < {hi}, got k={x1.shape[1]}")
    _require(bound["bias"] is None, kernel, "bias (added per rank before the reduction)")
    _require(bound.get("reduce_op", "sum") == "sum" and bound["comm_turn"] == 0, kernel, "reduce_op='sum', comm_turn=0")
    _require(bound.get("gather_index", 0) == 0, kernel, "gather_index=0")
    unused = [name for name, value in bound.items()
              if name not in _USED and value is not None and not (type(value) is int and value == 0)]
    _require(not unused, kernel, f"quantised-mode arguments {unused}")
    return rank, tp, transposed


#: Arguments the kernels below read; any other must keep its default.
_USED = {"x1", "self", "x2", "hcom", "world_size", "reduce_op", "bias", "comm_turn", "gather_index", "gather_output",
         "antiquant_scale", "antiquant_offset", "antiquant_group_size"}


def _antiquant_param(t: torch.Tensor, rows: int, n: int, transposed: bool, kernel: str, name: str) -> torch.Tensor:
    """A per-group scale or offset, read as the kernel reads it: ``[n, rows]`` row-major when x2 is transposed."""
    if transposed:
        _require(t.t().is_contiguous(), kernel, f"{name} must be transposed with x2 (per-group)")
        return t.as_strided((n, rows), (rows, 1)).t()
    _require(t.is_contiguous(), kernel, f"{name} must be ND with an ND x2 (per-group)")
    return t.as_strided((rows, n), (n, 1))


def _weight(bound: dict[str, Any], transposed: bool) -> torch.Tensor:
    """``x2`` as the all-reduce kernel multiplies it: dequantised ``(x2 + offset) * scale`` under w8A16."""
    kernel, x1, x2 = "npu_mm_all_reduce_base", _x1(bound), bound["x2"]
    scale, offset = bound.get("antiquant_scale"), bound.get("antiquant_offset")
    group = bound.get("antiquant_group_size", 0)
    if x2.dtype != torch.int8:
        _require(x2.dtype == x1.dtype and scale is None and offset is None, kernel, "x2 dtype and antiquant")
        return x2.float()
    limits = LIMITS[kernel]["w8a16"]
    k, n = x2.shape
    _require(scale is not None and scale.dtype == x1.dtype, kernel, "w8A16 needs antiquant_scale of x1's dtype")
    _require(max(k, n) <= limits["max_kn"], kernel, f"w8A16 k, n <= {limits['max_kn']}")
    params = [scale] if offset is None else [scale, offset]
    _require(all(p.shape == scale.shape and p.dtype == scale.dtype for p in params), kernel, "offset like scale")
    if group:
        align = limits["group_size_align"]
        _require(group % align == 0 and align <= group < k, kernel, f"group size {group}")
        rows = math.ceil(k / group)
        _require(tuple(scale.shape) == (rows, n), kernel, f"per-group scale [{rows}, {n}], got {list(scale.shape)}")
        read = [_antiquant_param(p, rows, n, transposed, kernel, "antiquant")
                .float().repeat_interleave(group, dim=0)[:k] for p in params]
    else:
        _require(tuple(scale.shape) in ((1,), (n,), (1, n)), kernel, f"antiquant_scale shape {list(scale.shape)}")
        read = [p.float().reshape(1, -1) for p in params]
    w = x2.float() + read[1] if offset is not None else x2.float()
    return (w * read[0]).to(x1.dtype).float()


def _all_reduce(bound: dict[str, Any], fake: FakeTorchNpu) -> torch.Tensor:
    _, tp, transposed = _common("npu_mm_all_reduce_base", bound, fake)
    x1 = _x1(bound)
    return (tp * (x1.float() @ _weight(bound, transposed))).to(x1.dtype)


def _reduce_scatter(bound: dict[str, Any], fake: FakeTorchNpu) -> torch.Tensor:
    kernel = "npu_mm_reduce_scatter_base"
    rank, tp, _ = _common(kernel, bound, fake)
    x1, x2 = bound["self"], bound["x2"]
    _require(x2.dtype == x1.dtype, kernel, "x2 dtype")
    _require(x1.shape[0] % tp == 0, kernel, f"m={x1.shape[0]} a multiple of tp={tp}")
    rows = x1.shape[0] // tp
    return (tp * (x1[rank * rows:(rank + 1) * rows].float() @ x2.float())).to(x1.dtype)


def _all_gather(bound: dict[str, Any], fake: FakeTorchNpu) -> tuple[torch.Tensor, torch.Tensor]:
    kernel = "npu_all_gather_base_mm"
    _, tp, _ = _common(kernel, bound, fake)
    x1, x2 = bound["self"], bound["x2"]
    _require(x2.dtype == x1.dtype, kernel, "x2 dtype")
    gathered = x1.repeat(tp, 1)
    out = (gathered.float() @ x2.float()).to(x1.dtype)
    return out, gathered if bound["gather_output"] else x1.new_empty(0)


_COMPUTE: dict[str, Callable[[dict[str, Any], FakeTorchNpu], Any]] = {
    "npu_mm_all_reduce_base": _all_reduce,
    "npu_mm_reduce_scatter_base": _reduce_scatter,
    "npu_all_gather_base_mm": _all_gather,
}


def _kernel(kernel: str, schema: Any) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        bound = _bind(schema, args, kwargs)
        fake = sys.modules["torch_npu"]
        fake.calls.append((kernel, bound))
        return _COMPUTE[kernel](bound, fake)

    return run


# --------------------------------------------------------------------------- definition, once per process

_LIBRARIES: list[torch.library.Library] = []


def define(namespace: str, schemas: dict[str, str]) -> types.SimpleNamespace:
    """Define ``schemas`` under ``torch.ops.<namespace>`` with the CPU kernels, unless already defined."""
    ops = getattr(torch.ops, namespace)
    todo = {kernel: line for kernel, line in schemas.items() if not hasattr(ops, kernel)}
    if todo:
        library = torch.library.Library(namespace, "DEF")
        for kernel, line in todo.items():
            library.define(line)
            library.impl(kernel, _kernel(kernel, torch._C.parse_schema(line)), "CPU")
        _LIBRARIES.append(library)  # a library's registrations live as long as the object
    return ops


OPS = define(NAMESPACE, SCHEMAS)
EARLY_OPS = define(EARLY_NAMESPACE, {**SCHEMAS, "npu_mm_all_reduce_base": EARLY_ALL_REDUCE})
