"""Stand-ins for the NPU stack MindSpeed's CoC imports, installed only when MindSpeed is loaded.

Each stands in only where the real module is absent, and only as far as
MindSpeed's CoC Python needs to run on a CPU.  The device they describe is
neutral: there is no NPU, so it has no name (``get_device_name`` raises),
and MindSpeed's own branches for particular Ascend models (a pure-torch
matmul-add on an Ascend 950, "fused kernel not supported on Ascend 950")
are never taken on a model it is not.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

#: What the ``megatron.training.get_args()`` stand-in returns (kept in step by the layer patch).
GLOBAL_ARGS = argparse.Namespace(gradient_accumulation_fusion=False)
#: In the ``__file__`` of every module the adapter stands in.
STAND_IN_MARK = "conformance.adapters.mindspeed stand-in"


class NativeKernelsUnavailable(ImportError, NotImplementedError):
    """A MindSpeed native kernel (ATB/LCAL/MatmulAdd) or the NPU it runs on is needed, and there is none.

    A ``NotImplementedError``: a case that reaches one on every rank skips
    with this message (a missing capability), never fails a check.
    """


def stub_module(name: str, **attrs: Any) -> types.ModuleType:
    """An empty module named ``name`` holding ``attrs``, marked as a stand-in."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__file__ = f"<{STAND_IN_MARK} for {name}>"
    module.__dict__.update(attrs)
    return module


def cpu_device(*_: Any) -> Any:
    import torch

    return torch.device("cpu")


def no_device_name(*_: Any) -> str:
    raise NativeKernelsUnavailable("there is no NPU here (torch_npu is the CPU stand-in of "
                                   "conformance.adapters.mindspeed): no device name, so no Ascend model's kernels")


def npu_namespace() -> types.SimpleNamespace:
    """``torch_npu.npu`` / ``torch.npu`` as MindSpeed's CoC calls them, answered for the CPU.

    ``current_device()`` is the ``device=`` of MindSpeed's buffers (its ``== 0``
    print gates are then False).  ``get_device_name()`` raises: MindSpeed's
    ``get_npu_version`` reads that as "no NPU" (0.17+); older branches let it
    propagate from the fp32 matmul-add, and the case skips for the kernel.
    """
    return types.SimpleNamespace(current_device=cpu_device, get_device_name=no_device_name,
                                 current_stream=lambda *_: None, synchronize=lambda *_: None,
                                 is_available=lambda: False)


def unavailable_builder(name: str) -> type:
    """A ``mindspeed.op_builder`` class whose ``load()`` raises :class:`NativeKernelsUnavailable`."""
    def load(self: Any, *_: Any, **__: Any) -> Any:
        raise NativeKernelsUnavailable(f"mindspeed.op_builder.{name}.load(): MindSpeed's native ATB/LCAL "
                                       "kernels need CANN and torch_npu; there is no CPU build of them")

    return type(name, (), {"load": load, "__init__": lambda self, *a, **k: None})


#: The native-op builders MindSpeed's CoC and the modules it imports construct.
BUILDERS = ("AtbOpBuilder", "LcalOpBuilder", "MatmulAddOpBuilder")


#: Where MindSpeed's op builders look for CANN (``mindspeed/op_builder/builder.py``); CANN's ``set_env.sh`` sets it.
CANN_HOME = "ASCEND_HOME_PATH"


def cann_installed() -> bool:
    """Whether MindSpeed's native-op builders would find CANN (its toolkit's directory), as they look for it."""
    home = os.environ.get(CANN_HOME)
    return bool(home) and os.path.isdir(home)  # type: ignore[arg-type]


def install_cpu_shims(stand_in_for: tuple[str, ...] = ()) -> None:
    """Stand-ins for what MindSpeed's CoC imports from the NPU stack, each only where the real one is absent.

    * ``torch_npu`` (``import torch_npu`` in the CoC files) and ``torch.npu``;
    * ``megatron.training`` (not in the megatron-core wheel before 0.18; where
      it is, its global args, if unset): ``get_args()``, read by the SP
      backward for ``gradient_accumulation_fusion``;
    * ``mindspeed.op_builder`` (its ``__init__`` imports every native-op
      builder, some needing ``torchair``): builders whose ``load()`` raises
      :class:`NativeKernelsUnavailable`.  Only where MindSpeed cannot build its
      kernels: without CANN (``ASCEND_HOME_PATH``, where MindSpeed's builders
      look for it), as on a CPU or the emulated NPU node, whose torch_npu has
      no CANN behind it;
    * the modules named in ``stand_in_for`` (the user's opt-in, see
      :mod:`.loading`): empty modules.
    """
    import torch

    if "torch_npu" not in sys.modules and importlib.util.find_spec("torch_npu") is None:
        sys.modules["torch_npu"] = stub_module("torch_npu", npu=npu_namespace(), __version__="0+cpu.stand.in")
        if not hasattr(torch, "npu"):
            torch.npu = stub_module("torch.npu", **vars(npu_namespace()))  # type: ignore[attr-defined]
    if not cann_installed() and "mindspeed.op_builder" not in sys.modules:
        sys.modules["mindspeed.op_builder"] = stub_module(
            "mindspeed.op_builder", **{n: unavailable_builder(n) for n in BUILDERS})
    if "megatron.training" not in sys.modules and importlib.util.find_spec("megatron.training") is None:
        import megatron

        stub = stub_module("megatron.training", get_args=lambda: GLOBAL_ARGS)
        sys.modules["megatron.training"] = stub
        megatron.training = stub
    else:  # megatron-core 0.18+ ships megatron.training: its get_args() answers GLOBAL_ARGS until a run sets its own
        from megatron.training import global_vars

        if global_vars._GLOBAL_ARGS is None:
            global_vars.set_args(GLOBAL_ARGS)
    for name in stand_in_for:
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = stub_module(name)
