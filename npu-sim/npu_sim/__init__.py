"""npu-sim: an emulated Ascend NPU node for PyTorch, on the CPU.

``npu_sim.activate()`` (or ``NPU_SIM=1`` in the environment, at ``import torch``) gives the process the
``npu`` device, ``torch.npu``, an ``hccl`` process-group backend, torch_npu's MC2 kernels and a
``torch_npu`` module, modelled on the published torch_npu, CANN and HCCL documentation (README.md).

Importing this package installs nothing; the names below import what they need when called.
"""

from __future__ import annotations

__all__ = ["activate", "is_active", "mc2_calls", "node"]


def activate() -> None:
    """Install the emulated NPU node into this process (idempotent; refused where a real torch_npu is installed)."""
    from npu_sim.activation import activate as _activate

    _activate()


def is_active() -> bool:
    from npu_sim.activation import is_active as _is_active

    return _is_active()


def mc2_calls() -> dict[str, int]:
    """How many calls each MC2 kernel ran in this process, by kernel name (0 for those never run)."""
    from npu_sim.mc2 import calls

    return calls()


def node() -> tuple[int, str]:
    """What ``torch.npu.device_count()`` and ``get_device_name()`` answer in a process started now with this
    environment (its cards, their SoC's name), read without importing torch or starting a runtime: a launcher
    counts the node's cards where starting one would make its forked children unable to use them."""
    from npu_sim import runtime, soc

    return runtime.device_count(), soc.configured()[0]
