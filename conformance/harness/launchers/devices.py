"""What the ranks run on: device kind, collective backend, how ranks bind.

Detection never initialises a device runtime in the pytest process (ranks are
spawned and must be able to choose their devices before the runtime starts).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.harness.launchers.npu_emulation import emulated_npu, identity_device, importable, real_torch_npu

#: Separates a device from a rank's place on it in a lease slot's name (``"0/1"``: device 0, second rank).
SLOT_SEP = "/"


class SharedDevicesError(ValueError):
    """Several ranks per device asked for where they cannot run (the message says why)."""


@dataclass(frozen=True)
class DeviceKind:
    """A device family: its collective backend and its visibility variable.

    ``ids`` are the node's devices as the visibility variable names them (the
    physical ids of the session's own ``ASCEND_RT_VISIBLE_DEVICES`` /
    ``CUDA_VISIBLE_DEVICES``, ascending; default ``0 .. count-1``): leases are
    named by them and ranks see exactly the ones they lease, so a session
    given cards 4-7 never runs on 0-3.

    ``ranks_per_device`` > 1 (``--coc-ranks-per-device``, ``docs/DESIGN.md#shared-devices``) leases that
    many slots of every device: a case of N ranks then holds N slots, on as many distinct devices as
    are free first, and ranks on one slot's device share it.
    """

    name: str
    backend: str
    visibility_var: str | None
    count: int
    ranks_per_device: int = 1
    ids: tuple[str, ...] = ()
    #: The emulated NPU node's (npu-sim): its devices are the host's memory and cores.
    emulated: bool = False

    def __post_init__(self) -> None:
        if self.ids and len(self.ids) != self.count:
            raise ValueError(f"{self.name}: {self.count} devices named by {len(self.ids)} ids {self.ids}")

    @property
    def binds_devices(self) -> bool:
        """Whether a rank must be pinned to its leased device (false for CPU slots)."""
        return self.visibility_var is not None

    @property
    def computes_on_host(self) -> bool:
        """Whether the devices' work is the host's CPU work (a CPU, the emulated NPU node): a rank's CPU time is then
        evidence of its progress, and it computes at a CPU's speed; on a real device a waiting rank spins."""
        return self.name == "cpu" or self.emulated

    @property
    def one_process_per_device(self) -> bool:
        """Whether a device takes one rank process at a time (``docs/DESIGN.md#leases-and-node-size``).

        An NPU runs one HCCL process per card (a second one binding it fails, ``EJ0003``; MC2 on Atlas A2
        needs the card to itself), so a pool never starts on a card whose idle pool still lives.  Several
        processes share a GPU (NCCL communicators of different processes coexist): CUDA pools may overlap.
        """
        return self.name == "npu"

    def devices(self) -> tuple[str, ...]:
        """The node's devices, as the visibility variable names them, in ascending order."""
        return self.ids or tuple(str(i) for i in range(self.count))

    def lease_names(self) -> list[str]:
        """One name per slot: the device ids, or ``"device/place"`` when ranks share devices (every
        device's first place before any second one, so ranks spread over the devices first)."""
        if self.ranks_per_device == 1:
            return list(self.devices())
        return [f"{d}{SLOT_SEP}{j}" for j in range(self.ranks_per_device) for d in self.devices()]

    def _visible(self, leased: Sequence[str]) -> list[str]:
        """The distinct devices of the slots ``leased``, in the node's (ascending) order: CANN takes only
        ascending lists, and a warm pool's devices come first in a lease."""
        order = {d: i for i, d in enumerate(self.devices())}
        distinct = dict.fromkeys(d.split(SLOT_SEP)[0] for d in leased)
        return sorted(distinct, key=lambda d: (order.get(d, len(order)), int(d) if d.isdigit() else 0))

    def visible_devices_env(self, devices: Sequence[str]) -> dict[str, str]:
        """Environment that makes exactly the leased devices visible, each once, in ascending order."""
        if self.visibility_var is None:
            return {}
        return {self.visibility_var: ",".join(self._visible(devices))}

    def rank_device(self, rank: int, devices: Sequence[str] = ()) -> str:
        """The device a rank uses once only its leased devices are visible (``devices``: the slots
        leased, rank ``i`` on slot ``i``'s device, whose index is its place in the ascending visible list)."""
        if self.name == "cpu":
            return "cpu"
        if not devices:
            return f"{self.name}:{rank}"
        return f"{self.name}:{self._visible(devices).index(devices[rank].split(SLOT_SEP)[0])}"


def visible_ids(variable: str, count: int) -> tuple[str, ...]:
    """The first ``count`` devices this process's ``variable`` names (``()`` when unset: ``0 .. count-1``),
    in ascending order where they are numbers (UUIDs keep their order)."""
    named = [d.strip() for d in os.environ.get(variable, "").split(",") if d.strip()][:count]
    if len(named) < count:
        return ()
    return tuple(sorted(named, key=int)) if all(d.isdigit() for d in named) else tuple(named)


def detect_device_kind(cpu_slots: int = 8, backend: str | None = None, ranks_per_device: int = 1) -> DeviceKind:
    """The best device family present: Ascend NPU, then CUDA, else CPU slots.

    ``cpu_slots`` is how many CPU ranks may run at once across all pytest
    workers of this machine (leases cap memory use, not placement).
    ``ranks_per_device`` > 1 shares each accelerator among that many ranks
    (:func:`shared`).
    """
    npu = _npu_count()
    if npu:
        kind = dataclasses.replace(_accelerator("npu", backend or "hccl", "ASCEND_RT_VISIBLE_DEVICES", npu),
                                   emulated=emulated_npu() and real_torch_npu() is None)
    else:
        cuda = _cuda_count()
        kind = _accelerator("cuda", backend or "nccl", "CUDA_VISIBLE_DEVICES", cuda) if cuda \
            else cpu(cpu_slots, backend)
    return kind if ranks_per_device == 1 else shared(kind, ranks_per_device, backend)


def _accelerator(name: str, backend: str, variable: str, count: int) -> DeviceKind:
    return DeviceKind(name, backend, variable, count, ids=visible_ids(variable, count))


def shared(kind: DeviceKind, ranks_per_device: int, backend: str | None = None) -> DeviceKind:
    """``kind`` with ``ranks_per_device`` ranks on each device, over gloo (``docs/DESIGN.md#shared-devices``).

    NCCL and HCCL refuse two ranks of one group on one device; gloo takes
    CUDA tensors (through pinned host copies) but no NPU tensors; CPU ranks
    share the cores already (``--coc-cpu-slots`` counts them).  Each of those
    is refused, saying so.
    """
    if kind.name == "cpu":
        raise SharedDevicesError("several ranks per device is for accelerators: CPU ranks already share the "
                                 "cores (--coc-cpu-slots says how many run at once)")
    if kind.name != "cuda":
        raise SharedDevicesError(f"several ranks on one {kind.name} device need a backend that takes "
                                 f"{kind.name} tensors from ranks sharing a device: hccl refuses it and gloo "
                                 f"takes CPU and CUDA tensors only")
    if backend not in (None, "gloo"):
        raise SharedDevicesError(f"several ranks on one device need --coc-backend gloo: {backend} refuses two "
                                 "ranks of one group on one device")
    return dataclasses.replace(kind, backend="gloo", ranks_per_device=ranks_per_device)


def cpu(slots: int = 8, backend: str | None = None) -> DeviceKind:
    return DeviceKind("cpu", backend or "gloo", None, slots)


def _torch_npu_present() -> bool:
    """Whether torch_npu can be imported, without importing it: installed, or the emulated node's."""
    return importable("torch_npu") or emulated_npu()


def _npu_count() -> int:
    """NPUs visible to the ranks, without starting ACL here (``docs/DESIGN.md#fork-safety``).

    ``torch.npu.device_count()`` in this process would initialise the NPU
    runtime, which a forked rank cannot then use: the visibility variable is
    read where it is set, else a short-lived subprocess counts (the emulated
    node answers here, without torch).
    """
    if not _torch_npu_present():
        return 0
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    return int(_runtime_probe("npu").get("count", 0))


@functools.cache
def _runtime_probe(kind: str) -> dict[str, Any]:
    """``{"count": N, "name": device 0's name}`` of a device runtime, asked in a subprocess (the runtime
    starts there, never in this process); ``{}`` when the subprocess fails (a broken install: no such
    devices for us).  The emulated NPU node answers in this process, reading its settings (no runtime, no
    torch)."""
    if kind == "npu" and emulated_npu() and real_torch_npu() is None:
        import npu_sim

        count, name = npu_sim.node()
        return {"count": count, "name": name if count else ""}
    module = "torch_npu" if kind == "npu" else "torch"
    script = (f"import json, torch, {module}\n"
              f"m = getattr(torch, {kind!r})\n"
              "n = int(m.device_count())\n"
              "print(json.dumps({'count': n, 'name': m.get_device_name(0) if n else ''}))")
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              check=True)
        found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return found
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def cpu_name() -> str:
    """The CPU's model name (what a CPU profile's ``name`` pattern is searched in)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def node_identity(kind: DeviceKind) -> dict[str, str]:
    """What a hardware profile matches on, less the TP: device kind, device name, collective backend.

    Read without starting a device runtime in this process: the CPU's name
    from ``/proc``, an accelerator's from a subprocess (once per process).
    """
    name = cpu_name() if kind.name == "cpu" else str(_runtime_probe(kind.name).get("name", ""))
    return {"device": identity_device(kind.name), "name": name, "backend": kind.backend}


#: Libraries a torch build that can see GPUs ships (CUDA, ROCm): without them ``torch.cuda`` sees none.
_GPU_LIBRARIES = ("*torch_cuda*", "*torch_hip*")


def _torch_sees_no_gpu() -> bool:
    """Whether the installed torch is a CPU-only build, read from its files without importing it.

    Importing torch costs seconds of CPU; on a CPU machine detection is the
    first thing to import it, ahead of the ranks' fork server.  Only a torch
    whose ``lib`` folder has its CPU library and no GPU library counts as
    CPU-only; any other layout is asked by importing torch.
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = Path(next(iter(spec.submodule_search_locations)), "lib")
    return any(lib.glob("*torch_cpu*")) and not any(any(lib.glob(name)) for name in _GPU_LIBRARIES)


def _cuda_count() -> int:
    if "torch" not in sys.modules and _torch_sees_no_gpu():
        return 0
    import torch

    # device_count() uses NVML where it can and does not initialise CUDA.
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def bind_device(device: str) -> None:
    """Make ``device`` this rank's current device before its process group exists.

    NCCL and HCCL bind each communicator to the current device: without this
    every rank of a node would start on device 0 (or one its rank guesses),
    and Megatron allocates on the current device too.  CPU ranks bind nothing.
    """
    kind = device.split(":", 1)[0]
    if kind == "cpu":
        return
    import torch

    if kind == "npu":
        import torch_npu  # noqa: F401 - registers torch.npu; imported in the rank, after the fork
    getattr(torch, kind).set_device(device)
