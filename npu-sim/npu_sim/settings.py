"""Every setting of the emulated node: environment variables, their defaults, and how they are read.

The emulator's own settings carry the ``NPU_SIM_`` prefix; ``NPU_SIM=1`` switches it on at ``import torch``
(:mod:`npu_sim.autoload`).  Two real variables are honoured as the Ascend stack honours them:
``ASCEND_RT_VISIBLE_DEVICES`` (CANN runtime, read when the runtime starts) and ``HCCL_DETERMINISTIC``
(HCCL, read when a communicator is created).  Each reader validates its value and raises
:class:`SettingError` naming the variable, so a mistyped setting is never silently ignored.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: ``1`` makes ``import torch`` activate the emulator (any other value, or none: it does nothing).
ENABLE = "NPU_SIM"
#: Number of NPU cards on the emulated node (physical ids ``0..N-1``).
CARDS = "NPU_SIM_CARDS"
DEFAULT_CARDS = 8
#: The SoC name ``torch.npu.get_device_name()`` answers (its code is ``get_soc_version()``): see :mod:`npu_sim.soc`.
SOC = "NPU_SIM_SOC"
DEFAULT_SOC = "Ascend910B3"  # Atlas A2
#: Directory of the node's per-card HCCL locks, shared by every process of the node.
NODE_DIR = "NPU_SIM_NODE_DIR"
#: Seconds an HCCL communicator takes to set up (default 0): lets tests model a slow HCCL set-up.
HCCL_SETUP_DELAY = "NPU_SIM_HCCL_SETUP_DELAY"

#: CANN: the physical cards a process sees, ascending, renumbered from 0 (envref "ASCEND_RT_VISIBLE_DEVICES").
VISIBLE_DEVICES = "ASCEND_RT_VISIBLE_DEVICES"
#: HCCL: ``false`` (default), ``true`` or ``strict`` (HCCL environment variable reference "HCCL_DETERMINISTIC").
HCCL_DETERMINISTIC = "HCCL_DETERMINISTIC"
HCCL_DETERMINISTIC_VALUES = ("false", "true", "strict")


class SettingError(ValueError):
    """An environment variable of the emulated node holds a value it does not take."""


def enabled() -> bool:
    return os.environ.get(ENABLE) == "1"


def cards() -> int:
    value = os.environ.get(CARDS, "")
    if not value:
        return DEFAULT_CARDS
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise SettingError(f"{CARDS}={value!r}: the number of cards on the node must be a positive integer")
    return count


def soc_name() -> str:
    return os.environ.get(SOC) or DEFAULT_SOC


def node_dir() -> Path:
    value = os.environ.get(NODE_DIR)
    if value:
        return Path(value)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() else Path(tempfile.gettempdir())
    return base / f"npu-sim-{os.getuid()}"


def hccl_setup_delay() -> float:
    value = os.environ.get(HCCL_SETUP_DELAY, "")
    if not value:
        return 0.0
    try:
        delay = float(value)
    except ValueError:
        delay = -1.0
    if not delay >= 0:
        raise SettingError(f"{HCCL_SETUP_DELAY}={value!r}: seconds, a number >= 0")
    return delay


def hccl_deterministic() -> bool:
    """Whether HCCL reduces in a fixed order (``true`` and ``strict``; ``false`` or unset: arrival order)."""
    value = os.environ.get(HCCL_DETERMINISTIC, "")
    if not value:
        return False
    if value.lower() not in HCCL_DETERMINISTIC_VALUES:
        raise SettingError(f"{HCCL_DETERMINISTIC}={value!r}: HCCL takes {', '.join(HCCL_DETERMINISTIC_VALUES)}")
    return value.lower() != "false"
