"""The ``torch.backends`` entry point: ``import torch`` calls :func:`autoload`, as it calls torch_npu's.

torch loads every entry point of that group while it is imported (``torch._import_device_backends``,
unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).  This one does nothing unless ``NPU_SIM=1`` is in the
environment, so a process meets the emulated node at ``import torch`` exactly when it asks for it: a
pytest run, a fork server, a rank, a subprocess.
"""

from __future__ import annotations

import os


def autoload() -> None:
    if os.environ.get("NPU_SIM") != "1":
        return
    from npu_sim.activation import activate

    activate()
