"""The ``hccl`` process-group backend of the emulated node, and its communicators.

``dist.init_process_group("hccl")`` (registered, as torch_npu registers it, for the ``npu`` device with
torch's extended backend API) gives each group an :class:`HcclBackend`: a ``ProcessGroupGloo`` subclass
whose gloo transport moves the bytes of the device's CPU storage.  The collectives themselves are
:mod:`npu_sim.collectives`; this module is the HCCL side of a group:

* its **communicator** is created lazily, as torch_npu's ProcessGroupHCCL creates its HCCL communicator:
  at the group's first collective, or when ``get_hccl_comm_name`` is asked (``init_comm=True``), not at
  ``init_process_group``.  Creating it takes ``NPU_SIM_HCCL_SETUP_DELAY`` seconds, holds this process's
  card (:mod:`npu_sim.cards`: a second live process on the card fails with HCCL's ``EJ0003``, on every
  rank of the group rather than hanging), reads ``HCCL_DETERMINISTIC`` (HCCL reads it at communicator
  creation) and names the communicator, the same name on every rank;
* the communicator is destroyed with its group (``destroy_process_group``), releasing the card.

A name from ``get_hccl_comm_name`` is what torch_npu's MC2 kernels take as ``hcom``: :func:`communicator_named`.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroupGloo

from npu_sim import cards, runtime, settings
from npu_sim.work import TRANSFER_WAIT


@dataclass
class Communicator:
    """An HCCL communicator of one group in this process."""

    name: str
    card: int
    #: ``HCCL_DETERMINISTIC`` as it was when the communicator was created.
    deterministic: bool
    backend: HcclBackend
    alive: bool = True


class HcclBackend(ProcessGroupGloo):
    """One group's HCCL backend: gloo moves the bytes, the communicator is HCCL's (see the module docstring)."""

    def __init__(self, store, group_rank: int, group_size: int, timeout, group_name: str, global_ranks) -> None:
        super().__init__(store, group_rank, group_size, timeout)
        self.group_name = group_name
        self.group_rank = group_rank
        self.group_size = group_size
        #: Global rank of each group rank.
        self.global_ranks: tuple[int, ...] = tuple(global_ranks) or tuple(range(group_size))
        self.communicator: Communicator | None = None
        self._creating = threading.Lock()

    def get_hccl_comm_name(self, rankid: int, *args, init_comm: bool = True, **kwargs) -> str:
        """The group's communicator name (created now if needed; ``init_comm=False``: "" when there is none)."""
        if rankid < 0:
            raise RuntimeError(f"Invalid rank {rankid}")
        if not init_comm and self.communicator is None:
            return ""
        return self.ensure_communicator().name

    def ensure_communicator(self) -> Communicator:
        """The group's communicator, created at the first call on every rank of the group."""
        communicator = self.communicator
        if communicator is not None and communicator.alive:
            return communicator
        with self._creating:
            if self.communicator is None or not self.communicator.alive:
                self.communicator = self._create()
            return self.communicator

    def _create(self) -> Communicator:
        card = runtime.physical_card()
        delay = settings.hccl_setup_delay()
        deterministic = settings.hccl_deterministic()
        if delay:
            time.sleep(delay)
        failure: cards.CardBusy | None = None
        try:
            cards.acquire(card)
        except cards.CardBusy as busy:
            failure = busy
        # Every rank learns whether every rank got its card, and rank 0's name for the communicator.
        mine = torch.tensor([failure is None, card, secrets.randbits(62)], dtype=torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.group_size)]
        try:
            TRANSFER_WAIT(ProcessGroupGloo.allgather(self, [everyone], [mine]))  # not the program's collective
        except BaseException:
            if failure is None:
                cards.release(card)
            raise
        if failure is not None:
            raise failure
        refused = [rank for rank, status in enumerate(everyone) if not status[0]]
        if refused:
            cards.release(card)
            held = ", ".join(f"rank {rank} (card {int(everyone[rank][1])})" for rank in refused)
            raise RuntimeError(
                f"HCCL communicator of group {self.group_name!r} was not created: {held} could not bind its card "
                "(EJ0003: another process holds HCCL communicators there)"
            )
        name = f"npusim_{self.group_name}_{int(everyone[0][2]):x}"
        communicator = Communicator(name, card, deterministic, self)
        with _REGISTRY_LOCK:
            _COMMUNICATORS[name] = communicator
        return communicator

    def destroy_communicator(self) -> None:
        communicator, self.communicator = self.communicator, None
        if communicator is None or not communicator.alive:
            return
        communicator.alive = False
        with _REGISTRY_LOCK:
            _COMMUNICATORS.pop(communicator.name, None)
        cards.release(communicator.card)
        for listener in DESTROY_LISTENERS:
            listener(communicator)


_REGISTRY_LOCK = threading.Lock()
#: Live communicators by name (what MC2 kernels look ``hcom`` up in).
_COMMUNICATORS: dict[str, Communicator] = {}
#: The backends of live groups, by group name (kept alive here: a backend's Python side must outlive the call
#: that created it, or torch hands back a bare ProcessGroupGloo later).
_BACKENDS: dict[str, list[HcclBackend]] = {}
#: Called with each communicator as it is destroyed.
DESTROY_LISTENERS: list[Callable[[Communicator], None]] = []


def communicator_named(name: str) -> Communicator | None:
    with _REGISTRY_LOCK:
        return _COMMUNICATORS.get(name)


def live_communicators() -> list[Communicator]:
    with _REGISTRY_LOCK:
        return list(_COMMUNICATORS.values())


def _create_backend(options, backend_options) -> HcclBackend:
    backend = HcclBackend(options.store, options.group_rank, options.group_size, options.timeout,
                          options.group_id, options.global_ranks_in_group)
    with _REGISTRY_LOCK:
        _BACKENDS.setdefault(options.group_id, []).append(backend)
    return backend


def _destroy_group(group_name: str | None) -> None:
    with _REGISTRY_LOCK:
        names = list(_BACKENDS) if group_name is None else [group_name]
        backends = [backend for name in names for backend in _BACKENDS.pop(name, [])]
    for backend in backends:
        backend.destroy_communicator()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's groups or communicators (nor its card locks)."""
    with _REGISTRY_LOCK:
        _COMMUNICATORS.clear()
        _BACKENDS.clear()
    cards.forget_after_fork()


_INSTALLED: list[bool] = []


def install() -> None:
    """Register the ``hccl`` backend for ``npu`` and follow group destruction (once per process)."""
    if _INSTALLED:
        return
    dist.Backend.register_backend("hccl", _create_backend, extended_api=True, devices=["npu"])
    # destroy_process_group ends by unregistering the group(s) by name: the moment HCCL's communicators go.
    unregister_one, unregister_all = c10d._unregister_process_group, c10d._unregister_all_process_groups

    def _unregister_process_group(group_name: str) -> None:
        _destroy_group(group_name)
        unregister_one(group_name)

    def _unregister_all_process_groups() -> None:
        _destroy_group(None)
        unregister_all()

    c10d._unregister_process_group = _unregister_process_group
    c10d._unregister_all_process_groups = _unregister_all_process_groups
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _INSTALLED.append(True)
