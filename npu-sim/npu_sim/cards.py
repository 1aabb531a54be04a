"""One HCCL process per card: a lock per physical card in the node directory.

HCCL binds a port per device when a process creates a communicator on it; a second live process doing so
on the same card fails (HCCL's ``EJ0003``: "Failed to bind the IP port. Reason: The IP address and port
have been bound already").  The emulator holds an exclusive POSIX record lock (``fcntl.lockf``) on
``<node dir>/card<N>.lock`` from a process's first communicator on card N until its last one there is
destroyed; the kernel drops it when the process ends, and a forked child does not inherit it (POSIX
locks belong to the process), as it does not inherit the parent's communicators.
"""

from __future__ import annotations

import fcntl
import os
import threading

from npu_sim import settings


class CardBusy(RuntimeError):
    """Another live process holds HCCL communicators on this card (HCCL error EJ0003)."""

    def __init__(self, card: int, holder: str) -> None:
        self.card = card
        self.holder = holder
        super().__init__(
            "createHCCLComm: HCCL function error: HcclGetRootInfo(&hcclID), error code is 11\n"
            "[ERROR] ERR02200 DIST call hccl api failed.\n"
            f"EJ0003: [PID: {os.getpid()}] Failed to bind the IP port. Reason: The IP address and port have been "
            f"bound already. (npu-sim: card {card} has HCCL communicators of process {holder})"
        )


class _Held:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 0


_HELD: dict[int, _Held] = {}
_LOCK = threading.Lock()


def _path(card: int):
    directory = settings.node_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / f"card{card}.lock"


def acquire(card: int) -> None:
    """Count one more communicator of this process on ``card``; :class:`CardBusy` if another process has it."""
    with _LOCK:
        held = _HELD.get(card)
        if held is None:
            fd = os.open(_path(card), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise CardBusy(card, holder) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            held = _HELD[card] = _Held(fd)
        held.count += 1


def release(card: int) -> None:
    """One communicator fewer on ``card``; the lock goes with the last."""
    with _LOCK:
        held = _HELD.get(card)
        if held is None:
            return
        held.count -= 1
        if held.count <= 0:
            del _HELD[card]
            os.ftruncate(held.fd, 0)
            os.close(held.fd)  # closing the descriptor drops the process's lock


def held() -> dict[int, int]:
    """Cards this process holds, with how many communicators each."""
    with _LOCK:
        return {card: entry.count for card, entry in _HELD.items()}


def forget_after_fork() -> None:
    """A forked child holds no card lock (POSIX locks are not inherited): drop the parent's bookkeeping."""
    with _LOCK:
        for entry in _HELD.values():
            try:
                os.close(entry.fd)
            except OSError:
                pass
        _HELD.clear()
