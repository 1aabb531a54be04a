"""Switching the emulated node on in the running process: :func:`activate`.

What it installs, in order: the ``npu`` device (PrivateUse1 renamed, torch's Python device hooks and
guard, ``torch.npu``), the tensor dispatch and the ops the device changes (GEMM, random ops,
``record_stream``), autocast, the ``hccl`` backend with its collectives and torch's functional ones, the
MC2 kernels, and the ``torch_npu`` facade.  Activating twice is harmless; activating where a real
torch_npu is installed is refused, so the emulator never stands in for the hardware's own stack.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading

import torch

from npu_sim import facade, settings, soc

_LOCK = threading.Lock()
_ACTIVE: list[bool] = []


class ActivationError(RuntimeError):
    """The emulator cannot be switched on in this process."""


def is_active() -> bool:
    return bool(_ACTIVE)


def _refuse_real_torch_npu() -> None:
    loaded = sys.modules.get("torch_npu")
    if loaded is not None and not facade.is_emulated(loaded):
        raise ActivationError(f"a real torch_npu is already imported ({getattr(loaded, '__file__', loaded)}); "
                              "npu-sim never stands in for it")
    if loaded is None:
        try:
            spec = importlib.util.find_spec("torch_npu")
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            raise ActivationError(f"a real torch_npu is installed ({spec.origin}); npu-sim never shadows it: "
                                  f"unset {settings.ENABLE} to use it")


def activate() -> None:
    """Install the emulated NPU node into this process (idempotent; see the module docstring)."""
    with _LOCK:
        if _ACTIVE:
            return
        _refuse_real_torch_npu()
        settings.cards()
        soc.configured()  # a bad setting fails here, not at the first device call
        name = torch._C._get_privateuse1_backend_name()
        if name not in ("privateuseone", "npu"):
            raise ActivationError(f"the PrivateUse1 device is already {name!r}")

        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        from npu_sim import autocast, collectives, functional, gemm, hccl, mc2, npu, rng, runtime, streams, tensor

        _setup_privateuseone_for_python_backend("npu", backend_module=npu, hook=npu.Hooks(),
                                                device_guard=npu.DeviceGuard())
        tensor.HANDLERS.update(gemm.handlers())
        tensor.HANDLERS.update(rng.handlers())
        tensor.HANDLERS[torch.ops.aten.record_stream.default] = streams.record_stream_handler
        tensor.NAMESPACE_HANDLERS["c10d"] = collectives.handle
        tensor.NAMESPACE_HANDLERS["_c10d_functional"] = functional.handle
        tensor.NAMESPACE_HANDLERS["npu"] = mc2.handle
        tensor.install(torch.device("npu", 0))
        runtime.install()
        autocast.install()
        os.register_at_fork(after_in_child=streams.clear_after_fork)
        hccl.install()
        mc2.install()
        facade.install()
        _ACTIVE.append(True)
