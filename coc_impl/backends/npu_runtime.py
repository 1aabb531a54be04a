"""The Ascend runtime as the fused ops' MC2 binding needs it: torch_npu, its SoC, a rank's device.

This is the only module of :mod:`coc_impl` that imports ``torch_npu``, and it does
so lazily (:func:`load`), so importing it on a machine without an NPU is cheap
and has no side effects.  The probe runs once per process; it says why the
backend cannot run (:func:`unavailable_reason`) rather than fail at the first
call.  The probe reads the schema the installed release registered
(``torch.ops.npu.<kernel>.default._schema``), so a release without an argument
the binding passes is reported, not called.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from coc_impl.errors import CoCArgumentError, CoCBackendUnavailable

__all__ = [
    "MC2_OPS",
    "SOC_FAMILIES",
    "VISIBLE_DEVICES_ENV",
    "Runtime",
    "bind_device",
    "init_process_group_kwargs",
    "is_available",
    "load",
    "npu_device",
    "registered_schema",
    "runtime",
    "soc_family",
    "unavailable_reason",
    "visible_devices_env",
]

#: Read by the Ascend runtime when it starts: the physical devices a process sees.
VISIBLE_DEVICES_ENV = "ASCEND_RT_VISIBLE_DEVICES"
#: The torch_npu kernels the MC2 binding calls.
MC2_OPS = ("npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base", "npu_all_gather_base_mm")
#: Product lines by ``torch_npu.npu.get_soc_version()`` code (torch_npu's ``c10_npu::SocVersion``).
SOC_FAMILIES: Mapping[str, range] = {"Atlas A2": range(220, 226), "Atlas A3": range(250, 257)}
#: Keyword arguments the binding passes to each kernel on every call.
_KEYWORDS = {
    "npu_mm_all_reduce_base": ("reduce_op", "comm_turn"),
    "npu_mm_reduce_scatter_base": ("reduce_op", "comm_turn"),
    "npu_all_gather_base_mm": ("gather_index", "gather_output", "comm_turn"),
}


@dataclass(frozen=True)
class Runtime:
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
def _probe() -> tuple[Runtime | None, str | None]:
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
    return Runtime(torch_npu, soc, arguments), None


def runtime() -> Runtime:
    """What the probe found, or :class:`CoCBackendUnavailable` with the reason."""
    found, reason = _probe()
    if found is None:
        raise CoCBackendUnavailable(f"Ascend backend unavailable: {reason}")
    return found


def load() -> ModuleType:
    """The ``torch_npu`` module, or :class:`CoCBackendUnavailable` with the reason."""
    return runtime().module


def is_available() -> bool:
    """True when torch_npu imports, an NPU is visible and the MC2 ops are registered."""
    return _probe()[0] is not None


def unavailable_reason() -> str | None:
    """Why :func:`is_available` is False (None when it is True)."""
    return _probe()[1]


def soc_family(soc: int) -> str | None:
    """The product line of a ``get_soc_version()`` code, or None for one the MC2 pages do not list."""
    return next((family for family, codes in SOC_FAMILIES.items() if soc in codes), None)


def npu_device(index: int | None = None) -> torch.device:
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
    return npu_device(local_index)


def init_process_group_kwargs() -> dict[str, Any]:
    """Keyword arguments of ``torch.distributed.init_process_group`` for HCCL ranks.

    Loads torch_npu first: importing it is what registers the ``hccl`` backend.
    """
    load()
    return {"backend": "hccl"}
