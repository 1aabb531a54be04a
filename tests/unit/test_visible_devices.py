"""What a rank sees of the node (docs/DESIGN.md#leases-and-node-size): a session given some of the node's cards
leases exactly those, by their ids, and each rank's visibility variable names its leased cards in ascending
order (CANN takes no other), with rank ``i`` on the device of its ``i``-th lease slot.

No accelerator here: detection is given a count, as the visibility variable or the runtime would give it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from coc_impl.backends import npu_runtime
from coc_impl.errors import CoCArgumentError
from conformance.harness.launchers import devices
from conformance.harness.leases import DeviceLeases

#: (device kind, its visibility variable)
KINDS = [("npu", "ASCEND_RT_VISIBLE_DEVICES"), ("cuda", "CUDA_VISIBLE_DEVICES")]


def _detect(monkeypatch: pytest.MonkeyPatch, name: str, variable: str, visible: str | None) -> devices.DeviceKind:
    """Detection on a node whose parent process sees ``visible`` (None: the variable unset, 8 devices)."""
    for var in ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    if visible is not None:
        monkeypatch.setenv(variable, visible)
    count = len(visible.split(",")) if visible is not None else 8
    monkeypatch.setattr(devices, "_torch_npu_present", lambda: name == "npu")
    monkeypatch.setattr(devices, "_runtime_probe", lambda _: {"count": count})
    monkeypatch.setattr(devices, "_cuda_count", lambda: count if name == "cuda" else 0)
    kind = devices.detect_device_kind()
    assert kind.name == name and kind.visibility_var == variable
    return kind


@pytest.mark.parametrize("name, variable", KINDS)
def test_a_subset_of_the_node_is_leased_by_its_ids_and_ranks_see_only_those(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, variable: str) -> None:
    kind = _detect(monkeypatch, name, variable, "4,5,6,7")
    assert kind.lease_names() == ["4", "5", "6", "7"]
    with DeviceLeases(tmp_path, kind.lease_names()).lease(2) as held:
        assert held == ("4", "5")
        assert kind.visible_devices_env(held) == {variable: "4,5"}
        assert [kind.rank_device(r, held) for r in range(2)] == [f"{name}:0", f"{name}:1"]
    assert _detect(monkeypatch, name, variable, None).lease_names() == [str(i) for i in range(8)]


@pytest.mark.parametrize("name, variable", KINDS)
def test_every_visible_list_is_ascending_and_rank_i_runs_on_its_ith_slot(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, variable: str) -> None:
    """A warm pool's devices come first in a lease (``prefer``): the list written is still ascending, and each
    rank's index in it points at the device of its own slot."""
    kind = _detect(monkeypatch, name, variable, "0,4,6,7")
    with DeviceLeases(tmp_path, kind.lease_names()).lease(4, prefer=("4", "6", "7")) as held:
        assert held == ("4", "6", "7", "0")
        assert kind.visible_devices_env(held) == {variable: "0,4,6,7"}
        assert [kind.rank_device(r, held) for r in range(4)] == [f"{name}:{i}" for i in (1, 2, 3, 0)]
    for held in itertools.permutations(kind.lease_names(), 3):
        visible = kind.visible_devices_env(held)[variable].split(",")
        assert visible == sorted(visible, key=int)
        assert [visible[int(kind.rank_device(r, held).split(":")[1])] for r in range(3)] == list(held)


def test_a_parent_list_out_of_order_and_shared_slots_still_give_ascending_lists(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kind = devices.shared(_detect(monkeypatch, "cuda", "CUDA_VISIBLE_DEVICES", "7,3"), 2)
    assert kind.lease_names() == ["3/0", "7/0", "3/1", "7/1"]
    held = ("7/0", "3/0", "7/1")
    assert kind.visible_devices_env(held) == {"CUDA_VISIBLE_DEVICES": "3,7"}
    assert [kind.rank_device(r, held) for r in range(3)] == ["cuda:1", "cuda:0", "cuda:1"]


def test_sessions_given_other_cards_of_the_node_never_free_each_others_leases(tmp_path: Path) -> None:
    """Two sessions of one user on one node share the lease directory; each reads and rewrites the state."""
    upper = DeviceLeases(tmp_path, ["4", "5", "6", "7"])
    lower = DeviceLeases(tmp_path, ["0", "1", "2", "3"])
    with upper.lease(1) as first:
        with lower.lease(1):
            pass
        with upper.lease(1) as second:
            assert set(first).isdisjoint(second)


def test_the_reference_binding_refuses_a_list_cann_would_not_take() -> None:
    assert npu_runtime.visible_devices_env([4, 6]) == {"ASCEND_RT_VISIBLE_DEVICES": "4,6"}
    with pytest.raises(CoCArgumentError, match="ascending"):
        npu_runtime.visible_devices_env([6, 4])
