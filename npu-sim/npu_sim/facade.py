"""``torch_npu`` as the emulator presents it: what ``import torch_npu`` gives once the emulator is active.

A module object in ``sys.modules`` (never a package on disk, so nothing can import it by accident):
``torch_npu.npu`` is ``torch.npu``, the MC2 kernels are ``torch_npu.<kernel>`` as torch_npu exports them,
and ``__version__`` says whose it is: :data:`VERSION`.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import torch

from npu_sim import contract

#: torch_npu's release whose contract the emulator follows, marked as the emulator's (a PEP 440 local version).
VERSION = "2.13.0+npusim"
#: ``torch_npu.__spec__.origin``: how code that inspects the module can tell it is the emulator's.
ORIGIN = "npu-sim"


def is_emulated(module: types.ModuleType | None) -> bool:
    spec = getattr(module, "__spec__", None)
    return spec is not None and spec.origin == ORIGIN


def install() -> types.ModuleType:
    """Put the facade in ``sys.modules["torch_npu"]`` (idempotent)."""
    existing = sys.modules.get("torch_npu")
    if is_emulated(existing):
        return existing
    module = types.ModuleType("torch_npu", "The emulated torch_npu of npu-sim (not Huawei's torch_npu).")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None, origin=ORIGIN)
    module.__version__ = VERSION
    module.npu = torch.npu
    for kernel in contract.SCHEMAS:
        setattr(module, kernel, getattr(torch.ops.npu, kernel))
    sys.modules["torch_npu"] = module
    sys.modules["torch_npu.npu"] = torch.npu
    return module
