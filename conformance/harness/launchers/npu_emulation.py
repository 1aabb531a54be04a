"""The emulated Ascend NPU node (npu-sim, ``docs/DESIGN.md#the-emulated-npu-node``): whether this session meets it,
switching it on, and the identity it shows hardware profiles -- read without importing torch."""

from __future__ import annotations

import importlib.util
import os
import sys

#: The emulated Ascend NPU node (npu-sim, ``docs/DESIGN.md#the-emulated-npu-node``): ``1`` switches it on at
#: ``import torch`` in every process that has it, as torch_npu's entry point loads torch_npu.
EMULATED_NPU_VAR = "NPU_SIM"


class EmulatedNpuError(ValueError):
    """The emulated NPU node cannot be switched on here (the message says why)."""


def importable(name: str) -> bool:
    """Whether module ``name`` can be imported, without importing it (one already in ``sys.modules`` counts, even
    without a ``__spec__``: CPU shims often lack one, and ``find_spec`` raises on them)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def real_torch_npu() -> str | None:
    """Where Huawei's torch_npu is, when it is installed or imported (the emulator's own module aside)."""
    loaded = sys.modules.get("torch_npu")
    if loaded is not None:
        spec = getattr(loaded, "__spec__", None)
        return None if spec is not None and spec.origin == "npu-sim" else str(getattr(loaded, "__file__", loaded))
    try:
        spec = importlib.util.find_spec("torch_npu")
    except (ImportError, ValueError):
        return None
    return None if spec is None else str(spec.origin)


def emulated_npu() -> bool:
    """Whether this session's processes meet the emulated NPU node at ``import torch`` (:data:`EMULATED_NPU_VAR`
    set and npu-sim installed), read without importing torch."""
    return os.environ.get(EMULATED_NPU_VAR) == "1" and importable("npu_sim")


#: The device kind the emulated NPU node shows hardware profiles: its own, never a real NPU's (its timings are the
#: host CPU's: no gate measured on Ascend hardware holds there).
EMULATED_NPU_IDENTITY = "npu-sim"


def identity_device(kind: str) -> str:
    """The device kind a hardware profile matches on for device kind ``kind`` of this node (``npu-sim`` for the
    emulated NPU node; the ranks and this process say it alike)."""
    return EMULATED_NPU_IDENTITY if kind == "npu" and emulated_npu() else kind


def emulate_npu() -> None:
    """Switch the emulated NPU node on for this process and every process it starts (``--coc-emulate-npu``).

    :data:`EMULATED_NPU_VAR` goes into the environment, so the fork servers, ranks, workers and subprocesses
    started from here meet the node at ``import torch``; where torch is imported already it is switched on
    here too.  Refused where npu-sim is not installed, or where a real torch_npu is: the emulator never stands in
    for the hardware's own stack.
    """
    if not importable("npu_sim"):
        raise EmulatedNpuError("the emulated NPU node needs npu-sim, which is not installed here "
                               "(pip install ./npu-sim from a checkout of coc-conformance)")
    real = real_torch_npu()
    if real is not None:
        raise EmulatedNpuError(f"a real torch_npu is installed ({real}): this node's own NPU stack is used, "
                               "never the emulated node in its place")
    import npu_sim

    try:
        npu_sim.node()  # a setting the node does not take (NPU_SIM_CARDS, NPU_SIM_SOC) is refused now
    except ValueError as exc:
        raise EmulatedNpuError(str(exc)) from None
    os.environ[EMULATED_NPU_VAR] = "1"
    if "torch" in sys.modules:
        npu_sim.activate()
