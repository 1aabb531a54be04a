"""What the ranks run on: device kind, collective backend, how ranks bind.

Detection never initialises a device runtime in the pytest process (ranks are
spawned and must be able to choose their devices before the runtime starts).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceKind:
    """A device family: its collective backend and its visibility variable."""

    name: str
    backend: str
    visibility_var: str | None
    count: int

    @property
    def binds_devices(self) -> bool:
        """Whether a rank must be pinned to its leased device (false for CPU slots)."""
        return self.visibility_var is not None

    def lease_names(self) -> list[str]:
        return [str(i) for i in range(self.count)]

    def visible_devices_env(self, devices: Sequence[str]) -> dict[str, str]:
        """Environment that makes exactly the leased devices visible, in lease order."""
        if self.visibility_var is None:
            return {}
        return {self.visibility_var: ",".join(devices)}

    def rank_device(self, rank: int) -> str:
        """The device a rank uses once only its leased devices are visible."""
        return "cpu" if self.name == "cpu" else f"{self.name}:{rank}"


def detect_device_kind(cpu_slots: int = 8, backend: str | None = None) -> DeviceKind:
    """The best device family present: Ascend NPU, then CUDA, else CPU slots.

    ``cpu_slots`` is how many CPU ranks may run at once across all pytest
    workers of this machine (leases cap memory use, not placement).
    """
    npu = _npu_count()
    if npu:
        return DeviceKind("npu", backend or "hccl", "ASCEND_RT_VISIBLE_DEVICES", npu)
    cuda = _cuda_count()
    if cuda:
        return DeviceKind("cuda", backend or "nccl", "CUDA_VISIBLE_DEVICES", cuda)
    return cpu(cpu_slots, backend)


def cpu(slots: int = 8, backend: str | None = None) -> DeviceKind:
    return DeviceKind("cpu", backend or "gloo", None, slots)


def _torch_npu_present() -> bool:
    """Whether torch_npu can be imported, without importing it.

    A module already in ``sys.modules`` counts as present even without a
    ``__spec__`` (CPU shims often lack one, and ``find_spec`` raises on them).
    """
    import sys

    if "torch_npu" in sys.modules:
        return sys.modules["torch_npu"] is not None
    try:
        return importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):
        return False


def _npu_count() -> int:
    if not _torch_npu_present():
        return 0
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        import torch
        import torch_npu  # noqa: F401 - registers the npu device

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a broken install means no NPU for us
        return 0


def _cuda_count() -> int:
    import torch

    # device_count() uses NVML where it can and does not initialise CUDA.
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
