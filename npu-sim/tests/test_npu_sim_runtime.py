"""The runtime: visible devices by CANN's rules, when the runtime starts, the fork rule, the SoC, settings."""

from __future__ import annotations

import pytest

from npu_sim.testing import ChildFailed, in_npu_process


def _devices(select: int | None):
    import torch

    from npu_sim import runtime

    facts = {"count": torch.npu.device_count(), "available": torch.npu.is_available(),
             "started": torch.npu.is_initialized()}
    if select is not None:
        torch.npu.set_device(select)
        facts["current"] = torch.npu.current_device()
        facts["card"] = runtime.physical_card()
        facts["started"] = torch.npu.is_initialized()
    return facts


def test_a_subset_is_renumbered_from_zero():
    facts = in_npu_process(_devices, 1, env={"ASCEND_RT_VISIBLE_DEVICES": "2,5"})
    assert facts == {"count": 2, "available": True, "started": True, "current": 1, "card": 5}


def test_the_whole_node_without_the_variable():
    facts = in_npu_process(_devices, 7, env={"ASCEND_RT_VISIBLE_DEVICES": None, "NPU_SIM_CARDS": "8"})
    assert facts == {"count": 8, "available": True, "started": True, "current": 7, "card": 7}


def test_counting_devices_does_not_start_the_runtime():
    facts = in_npu_process(_devices, None, env={"ASCEND_RT_VISIBLE_DEVICES": "0,1"})
    assert facts == {"count": 2, "available": True, "started": False}


def test_a_card_the_process_does_not_see_is_refused():
    with pytest.raises(ChildFailed, match=r"Invalid device ordinal npu:2: this process sees 2 NPU"):
        in_npu_process(_devices, 2, env={"ASCEND_RT_VISIBLE_DEVICES": "2,5"})


@pytest.mark.parametrize("listed", ["4,6,7,0", "1,1"])
def test_lists_out_of_ascending_order_fail_when_the_runtime_starts(listed):
    facts = in_npu_process(_devices, None, env={"ASCEND_RT_VISIBLE_DEVICES": listed})
    assert facts == {"count": 0, "available": False, "started": False}  # torch_npu's driver count: nothing usable
    with pytest.raises(ChildFailed, match=rf"EE1001.*ASCEND_RT_VISIBLE_DEVICES:{listed} error, it must be "
                                          "configured in ascending order"):
        in_npu_process(_devices, 0, env={"ASCEND_RT_VISIBLE_DEVICES": listed})


def test_a_card_the_node_lacks_fails_when_the_runtime_starts():
    facts = in_npu_process(_devices, None, env={"ASCEND_RT_VISIBLE_DEVICES": "1,9", "NPU_SIM_CARDS": "8"})
    assert facts["count"] == 1  # the cards before the first one the node lacks
    with pytest.raises(ChildFailed, match=r"ASCEND_RT_VISIBLE_DEVICES:\[9\] error, input data range\[0-8\)"):
        in_npu_process(_devices, 0, env={"ASCEND_RT_VISIBLE_DEVICES": "1,9", "NPU_SIM_CARDS": "8"})


def _fork_after(start_first: bool):
    import os

    import torch

    if start_first:
        torch.ones(1, device="npu")  # allocating starts the runtime
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            value = torch.ones(2, device="npu").sum().item()
            message = f"ok {value}"
        except RuntimeError as error:
            message = str(error)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.waitpid(pid, 0)
    return message


def test_a_child_forked_after_the_runtime_started_cannot_use_the_device():
    assert in_npu_process(_fork_after, True).startswith("Cannot re-initialize NPU in forked subprocess")


def test_a_child_forked_before_the_runtime_started_starts_its_own():
    assert in_npu_process(_fork_after, False) == "ok 2.0"


def _soc():
    import torch

    return torch.npu.get_device_name(), torch.npu.get_soc_version()


def test_the_soc_is_chosen():
    assert in_npu_process(_soc) == ("Ascend910B3", 223)
    assert in_npu_process(_soc, env={"NPU_SIM_SOC": "Ascend910_9391"}) == ("Ascend910_9391", 250)


@pytest.mark.parametrize("env, match", [
    ({"NPU_SIM_SOC": "Ascend310P3"}, r"NPU_SIM_SOC='Ascend310P3': one of Ascend910B1"),
    ({"NPU_SIM_CARDS": "0"}, r"NPU_SIM_CARDS='0'"),
])
def test_a_bad_setting_fails_at_activation(env, match):
    with pytest.raises(ChildFailed, match=match):
        in_npu_process(_soc, env=env)
