"""One rank process per NPU card (docs/DESIGN.md#leases-and-node-size): a pool never starts on a card an idle
pool still holds -- HCCL binds a card to one process (a second fails, ``EJ0003``) -- while GPU pools may overlap.

Pools here are stand-ins that claim their cards as HCCL would (a card claimed twice fails the start) and free
them only once closed; on a node with NPUs (or the emulated one) the last test runs real pools."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from conformance.harness.case import RankTask
from conformance.harness.case_errors import RankCrashed
from conformance.harness.launchers import devices, process_launcher
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.process_launcher import ProcessLauncher
from tests.support import rank_cases

IMPL = "coc_impl.reference:ReferenceCoC"
NPUS = DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", 4)
GPUS = DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES", 4)


class _Cards:
    """Which pool holds each card; a pool whose ranks bind a held card fails to start, as HCCL's would."""

    def __init__(self, exclusive: bool, close_s: float) -> None:
        self.exclusive, self.close_s = exclusive, close_s
        self.held: dict[str, object] = {}
        self.closing = threading.Event()
        self.lock = threading.Lock()


class _StandInPool:
    """The part of :class:`~conformance.harness.launchers.process_pool.RankPool` the launcher uses."""

    cards: _Cards

    def __init__(self, world_size: int, kind: DeviceKind, devices: Sequence[str], **_: Any) -> None:
        self.world_size, self.devices = world_size, tuple(devices)
        self.idle_since: float | None = None
        self.last_start_s = 0.0
        self.alive = False

    def run(self, task: RankTask, *_: Any, **__: Any) -> list[str]:
        self.last_start_s = 0.0
        if not self.alive:
            with self.cards.lock:
                taken = [d for d in self.devices if d in self.cards.held] if self.cards.exclusive else []
                if taken:
                    raise RankCrashed(f"rank pool of {self.world_size} failed to start: card(s) {taken} bound by "
                                      "another process (EJ0003)")
                self.cards.held.update(dict.fromkeys(self.devices, self))
            self.alive, self.last_start_s = True, 0.01
        return ["ran"] * self.world_size

    def ask_to_stop(self) -> None:
        pass

    def close(self, *, kill: bool = False) -> None:
        self.cards.closing.set()
        time.sleep(self.cards.close_s)  # its ranks take a while to exit
        with self.cards.lock:
            for d in self.devices:
                if self.cards.held.get(d) is self:
                    del self.cards.held[d]
        self.alive = False


@pytest.fixture
def cards(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[_Cards]:
    kind: DeviceKind = request.param
    found = _Cards(kind.one_process_per_device, close_s=0.3)
    monkeypatch.setattr(_StandInPool, "cards", found, raising=False)
    monkeypatch.setattr(process_launcher, "RankPool", _StandInPool)
    yield found


def _launcher(kind: DeviceKind) -> ProcessLauncher:
    return ProcessLauncher(kind, max_live_ranks=64, fork_server=False, retire_idle_s=3600)


@pytest.mark.parametrize("cards", [NPUS, GPUS], indirect=True, ids=["npu", "cuda"])
def test_a_pool_starts_on_a_card_only_once_the_idle_pool_holding_it_has_exited(cards: _Cards) -> None:
    kind = NPUS if cards.exclusive else GPUS
    launcher = _launcher(kind)
    try:
        assert launcher.run(RankTask(rank_cases.pid, 4), ("0", "1", "2", "3"), IMPL) == ["ran"] * 4
        assert launcher.run(RankTask(rank_cases.pid, 2), ("0", "1"), IMPL) == ["ran"] * 2
        assert launcher.run(RankTask(rank_cases.pid, 1), ("3",), IMPL) == ["ran"]
        pools = {key.devices for key, _ in launcher._idle}
        if kind.one_process_per_device:  # each card's last pool only: the pool of 4 was closed for the pool of 2
            assert pools == {("0", "1"), ("3",)} and set(cards.held) == {"0", "1", "3"}
        else:  # GPUs take several processes: the pools stay warm side by side
            assert pools == {("0", "1", "2", "3"), ("0", "1"), ("3",)}
        assert launcher.pools_started() == 3
    finally:
        launcher.close()


@pytest.mark.parametrize("cards", [NPUS], indirect=True, ids=["npu"])
def test_a_pool_waits_for_a_pool_another_case_is_closing_on_its_cards(cards: _Cards) -> None:
    """Case A's pool start closes the idle pool of 4 (it holds A's cards 2, 3); case B, on cards 0 and 1, starts
    while those ranks are still exiting: it waits for them."""
    launcher = _launcher(NPUS)
    try:
        launcher.run(RankTask(rank_cases.pid, 4), ("0", "1", "2", "3"), IMPL)
        results: dict[str, object] = {}

        def case(name: str, devices: tuple[str, ...]) -> None:
            try:
                results[name] = launcher.run(RankTask(rank_cases.pid, 2), devices, IMPL)
            except RankCrashed as exc:
                results[name] = exc

        first = threading.Thread(target=case, args=("A", ("2", "3")))
        first.start()
        assert cards.closing.wait(10)
        case("B", ("0", "1"))
        first.join(10)
        assert results == {"A": ["ran"] * 2, "B": ["ran"] * 2}
    finally:
        launcher.close()


def test_a_pool_never_shares_a_card_with_an_idle_pool_on_this_node() -> None:
    """Real pools on the node's NPUs (hardware, or the emulated node): a pool of 2 then a pool of 1 on one of
    its cards, the first still warm."""
    kind = devices.detect_device_kind()
    if not kind.one_process_per_device or kind.count < 2:
        pytest.skip(f"needs two devices that take one process each; this node has {kind.count} {kind.name}")
    launcher = ProcessLauncher(kind, max_live_ranks=16, retire_idle_s=3600)
    try:
        cards = kind.lease_names()[:2]
        first = launcher.run(RankTask(rank_cases.pid, 2), cards, IMPL)
        second = launcher.run(RankTask(rank_cases.pid, 1), cards[:1], IMPL)
        assert second[0].error is None and not set(o.value for o in first) & {second[0].value}
    finally:
        launcher.close()
