"""What crosses a process boundary of the harness reads back as it was sent, whatever the tensor's layout."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from conformance.harness import wire


@dataclass
class _Outcome:
    rank: int
    value: Any


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The values as bytes (NaN equals the same NaN)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.storage_offset() == b.storage_offset() and a.requires_grad == b.requires_grad
            and a.untyped_storage().nbytes() == b.untyped_storage().nbytes() and torch.equal(_bits(a), _bits(b)))


TENSORS = {
    "float32": lambda: torch.randn(5, 7),
    "strided-view": lambda: torch.randn(6, 8)[1:, ::3],
    "transposed": lambda: torch.arange(12.0).view(3, 4).t(),
    "bfloat16": lambda: torch.randn(9, dtype=torch.bfloat16),
    "float16-nan": lambda: torch.tensor([float("nan"), 1.0, -0.0], dtype=torch.float16),
    "int8": lambda: torch.randint(-128, 127, (4, 4), dtype=torch.int8),
    "bool": lambda: torch.tensor([True, False, True]),
    "complex": lambda: torch.randn(3, dtype=torch.complex64),
    "empty": lambda: torch.zeros(0, 4),
    "scalar": lambda: torch.tensor(3.5),
    "requires-grad": lambda: torch.randn(3, requires_grad=True),
    "parameter": lambda: torch.nn.Parameter(torch.randn(2, 3)),
}


@pytest.mark.parametrize("make", TENSORS.values(), ids=TENSORS.keys())
def test_a_tensor_reads_back_with_its_dtype_shape_strides_and_values(make: Any) -> None:
    sent = make()
    received = pickle.loads(wire.dumps(sent))
    assert _same(received, sent)
    assert _same(received, pickle.loads(pickle.dumps(sent)))  # as torch's own pickling gives it


def test_an_outcome_holding_tensors_reads_back_and_its_storages_travel_as_bytes() -> None:
    result = torch.randn(64, 48)
    sent = _Outcome(3, {"result": result, "copy": result.clone(), "calls": [(torch.ones(2), None)]})
    data = wire.dumps(sent)
    received = pickle.loads(data)
    assert received.rank == 3 and _same(received.value["result"], result)
    assert _same(received.value["calls"][0][0], torch.ones(2)) and received.value["calls"][0][1] is None
    assert b"_load_from_bytes" not in data and b"_load_from_bytes" in pickle.dumps(sent)  # no torch.save archive


def test_a_storage_off_the_cpu_is_left_to_torch() -> None:
    sent = torch.empty(3, 2, device="meta")
    received = pickle.loads(wire.dumps(sent))
    assert received.device.type == "meta" and received.shape == sent.shape


def test_dumps_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the rank server a thread may answer while another imports torch; importing ``torch.storage`` beside a
    half-initialised torch fails, so until torch has defined its storages a pickle is a plain one."""
    monkeypatch.delitem(sys.modules, "torch.storage")
    assert pickle.loads(wire.dumps({"pools_started": 2})) == {"pools_started": 2}
    assert "torch.storage" not in sys.modules
