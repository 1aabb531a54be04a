"""A rank's operands are made on its device, in every layout: a GPU's or an NPU's collectives take only tensors of
their own device (drawn on the CPU from the problem's seed, so every device sees the same numbers)."""

from __future__ import annotations

import pytest

from conformance.cases.groups import TPPlace
from conformance.cases.op_cases import rank_operands
from conformance.contract.jobs import OPERAND_STRIDES
from conformance.contract.problems import Problem


@pytest.mark.parametrize("strides", OPERAND_STRIDES)
@pytest.mark.parametrize("op", ["matmul_all_reduce", "all_gather_matmul"])
def test_operands_are_made_on_the_ranks_device_in_every_layout(op: str, strides: str) -> None:
    place = TPPlace(group=None, tp_rank=1, replica=0, members=(0, 1))
    problem = Problem(4, 6, 5, "float32", bias=True, seed=3)
    on_cpu = rank_operands(problem, op, place, False, strides)
    on_device = rank_operands(problem, op, place, False, strides, device="meta")
    for name, tensor in on_cpu.items():
        placed = on_device[name]
        assert placed.device.type == "meta", name
        assert (placed.shape, placed.stride(), placed.storage_offset()) == \
            (tensor.shape, tensor.stride(), tensor.storage_offset()), (name, strides)
