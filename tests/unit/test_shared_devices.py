"""Several ranks on one accelerator (``--coc-ranks-per-device``, docs/DESIGN.md#shared-devices): lease slots,
what each rank sees, and where it is refused.  No GPU here: the device kinds are described, not detected."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.harness.launchers.devices import DeviceKind, SharedDevicesError, cpu, shared
from conformance.harness.leases import DeviceLeases, LeaseUnsatisfiable

ONE_GPU = DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES", 1)
TWO_GPUS = DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES", 2)


def test_each_device_has_n_slots_and_ranks_spread_over_devices_first() -> None:
    kind = shared(TWO_GPUS, 2)
    assert kind.backend == "gloo" and kind.ranks_per_device == 2
    assert kind.lease_names() == ["0/0", "1/0", "0/1", "1/1"]
    assert ONE_GPU.lease_names() == ["0"] and TWO_GPUS.lease_names() == ["0", "1"]  # unshared: as before


def test_ranks_sharing_a_device_see_it_once_and_all_use_it(tmp_path: Path) -> None:
    kind = shared(ONE_GPU, 2)
    with DeviceLeases(tmp_path, kind.lease_names()).lease(2) as held:
        assert sorted(held) == ["0/0", "0/1"]
        assert kind.visible_devices_env(held) == {"CUDA_VISIBLE_DEVICES": "0"}
        assert [kind.rank_device(r, held) for r in range(2)] == ["cuda:0", "cuda:0"]
    mixed = ("1/0", "0/1", "1/1")
    assert shared(TWO_GPUS, 2).visible_devices_env(mixed) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert [shared(TWO_GPUS, 2).rank_device(r, mixed) for r in range(3)] == ["cuda:1", "cuda:0", "cuda:1"]
    assert TWO_GPUS.rank_device(1, ("3", "5")) == "cuda:1"


def test_n_ranks_per_device_is_what_the_node_can_hold(tmp_path: Path) -> None:
    """One GPU shared by two ranks holds a TP-2 case, never a TP-4 one."""
    leases = DeviceLeases(tmp_path, shared(ONE_GPU, 2).lease_names())
    with pytest.raises(LeaseUnsatisfiable, match="needs 4 devices, this node has 2"), leases.lease(4):
        pass


@pytest.mark.parametrize("kind, backend, why", [
    (cpu(8), None, "CPU ranks already share the cores"),
    (DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", 8), None, "gloo takes CPU and CUDA tensors only"),
    (ONE_GPU, "nccl", "need --coc-backend gloo: nccl refuses"),
])
def test_sharing_is_refused_where_ranks_cannot_share_a_device(kind: DeviceKind, backend: str | None,
                                                              why: str) -> None:
    with pytest.raises(SharedDevicesError, match=why):
        shared(kind, 2, backend)
