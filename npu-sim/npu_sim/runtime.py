"""The NPU runtime of one process: which cards it sees, when it starts, its current card, the fork rule.

As CANN's runtime does (environment variable reference, "ASCEND_RT_VISIBLE_DEVICES"):

* ``ASCEND_RT_VISIBLE_DEVICES`` lists the physical cards a process sees, which it then numbers ``0..n-1``;
  the list is read up to the first character that is neither a digit nor a comma.  Only ascending lists
  are supported: when the runtime starts, a list out of order (or with a card twice) fails with CANN's
  ``EE1001 ... it must be configured in ascending order``, and a card the node does not have with its
  ``input data range`` error.  Before the runtime starts, :func:`device_count` answers as torch_npu's
  (which asks the driver, not the runtime): 0 for a list out of order, the cards before the first one the
  node lacks otherwise.
* The runtime starts at the first call that needs it, as torch_npu's ``_lazy_init`` does: ``set_device``,
  ``current_device``, ``synchronize``, ``get_soc_version``, a stream, or allocating on the device;
  ``device_count`` and ``is_available`` do not start it.
* A process forked after the runtime started cannot use the device (torch_npu: "Cannot re-initialize NPU
  in forked subprocess ..."); one forked before it started (a fork server) starts its own.

Torch's Python device guard reports one device, index 0, so every tensor says ``npu:0``; the card the
process computes on is :func:`current_device` (mapped to a physical card by :func:`physical_card`), which
is what HCCL's per-card rule looks at.
"""

from __future__ import annotations

import os
import threading

from npu_sim import settings, soc


class _State:
    """This process's runtime (one per process; reset in a forked child)."""

    def __init__(self) -> None:
        self.started = False
        self.bad_fork = False
        self.pid = 0
        #: Physical card ids this process sees, by local index.
        self.visible: tuple[int, ...] = ()
        self.current = 0
        self.soc_name = ""
        self.soc_code = 0


STATE = _State()
_LOCK = threading.Lock()


def _read_visible(value: str) -> list[int]:
    """The card ids of a visible-devices value, read as CANN reads them: up to the first foreign character."""
    ids: list[int] = []
    for field in value.split(","):
        digits = ""
        for char in field:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        ids.append(int(digits))
        if len(digits) != len(field):
            break
    return ids


def device_count() -> int:
    """Cards this process sees; before the runtime starts, torch_npu's driver count (never raises)."""
    if STATE.started:
        return len(STATE.visible)
    cards = settings.cards()
    value = os.environ.get(settings.VISIBLE_DEVICES)
    if value is None:
        return cards
    ids = _read_visible(value)
    for index, card in enumerate(ids):
        if index and card <= ids[index - 1]:
            return 0
        if card >= cards:
            return index
    return len(ids)


def _visible_at_start(cards: int) -> tuple[int, ...]:
    value = os.environ.get(settings.VISIBLE_DEVICES)
    if value is None:
        return tuple(range(cards))
    ids = _read_visible(value)
    if any(later <= earlier for earlier, later in zip(ids, ids[1:])):
        raise RuntimeError(
            f"the NPU runtime failed to start: EE1001: The argument is invalid.Reason: set "
            f"{settings.VISIBLE_DEVICES}:{value} error, it must be configured in ascending order"
        )
    beyond = [card for card in ids if card >= cards]
    if beyond:
        raise RuntimeError(
            f"the NPU runtime failed to start: set {settings.VISIBLE_DEVICES}:[{beyond[0]}] error, "
            f"input data range[0-{cards}) (this node has {cards} NPUs)"
        )
    if not ids:
        raise RuntimeError(
            f"the NPU runtime failed to start: no NPU is visible ({settings.VISIBLE_DEVICES}={value!r})"
        )
    return tuple(ids)


def raise_bad_fork() -> None:
    raise RuntimeError(
        "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
        "you must use the 'spawn' start method"
    )


def start() -> None:
    """Start the runtime (once): read the node's settings and this process's visible cards."""
    if STATE.started:
        return
    with _LOCK:
        if STATE.started:
            return
        if STATE.bad_fork:
            raise_bad_fork()
        STATE.soc_name, STATE.soc_code = soc.configured()
        STATE.visible = _visible_at_start(settings.cards())
        STATE.current = 0
        STATE.pid = os.getpid()
        STATE.started = True


def device_index(device) -> int | None:
    """The index of ``device`` (int, ``"npu:1"``, ``torch.device``; None or negative: none given)."""
    if device is None:
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    import torch

    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"Expected an npu device, got {device}")
    return device.index


def check_device_index(index: int | None) -> None:
    """Start the runtime and refuse a device index this process does not see."""
    start()
    if index is not None and not 0 <= index < len(STATE.visible):
        raise RuntimeError(
            f"Invalid device ordinal npu:{index}: this process sees {len(STATE.visible)} NPU(s) "
            f"(physical cards {list(STATE.visible)})"
        )


def set_device(device) -> None:
    index = device_index(device)
    if index is None:
        return
    check_device_index(index)
    STATE.current = index


def current_device() -> int:
    start()
    return STATE.current


def physical_card(index: int | None = None) -> int:
    """The node's card id behind local device ``index`` (default: the current one)."""
    start()
    return STATE.visible[STATE.current if index is None else index]


def _after_fork_in_child() -> None:
    if STATE.started:
        STATE.started = False
        STATE.bad_fork = True


_FORK_HOOK: list[bool] = []


def install() -> None:
    """Register the fork rule (once per process)."""
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORK_HOOK.append(True)
