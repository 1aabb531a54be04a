"""Fresh allocations are poisoned while an implementation runs (docs/DESIGN.md#harness), without resetting the
determinism switch of a device that takes torch's deterministic-algorithms flag as its own (torch_npu maps the flag
onto CANN's deterministic level, and derives ``set_deterministic_level`` from it).

No NPU here: a stand-in for torch_npu's coupling records the levels the flag sets; the tensors are CPU ones."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.cases.memory import poisoned_allocations


class _Levels:
    """torch_npu's coupling: ``torch.use_deterministic_algorithms(on)`` sets CANN's deterministic level 1 / 0."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.level = 2  # what the implementation chose: torch_npu.npu.set_deterministic_level(2)
        original = torch.use_deterministic_algorithms

        def coupled(mode: bool, *, warn_only: bool = False) -> None:
            self.level = int(bool(mode))
            original(mode, warn_only=warn_only)

        monkeypatch.setattr(torch, "use_deterministic_algorithms", coupled)


def _fresh() -> list[torch.Tensor]:
    like = torch.ones(2, 3)
    return [torch.empty(4), like.new_empty(2, 2, dtype=torch.int32), torch.empty_like(like, dtype=torch.bool),
            torch.empty_strided((2, 2), (1, 2), dtype=torch.float16), like.new_empty_strided((3,), (2,))]


@pytest.mark.parametrize("device", ["cpu", "npu:0"])
def test_fresh_tensors_are_poisoned_inside_the_block_only(device: str) -> None:
    with poisoned_allocations(device=device):
        fresh = _fresh()
        computed = torch.ones(2) * 3
    floats, ints, flags, halves, strided = fresh
    assert all(math.isnan(v) for t in (floats, halves, strided) for v in t.flatten().tolist())
    assert ints.eq(torch.iinfo(torch.int32).max).all() and flags.all() and computed.tolist() == [3.0, 3.0]
    with poisoned_allocations(on=False, device=device):
        assert not torch.empty(0).numel()  # nothing is done, nothing breaks


def test_on_an_npu_the_deterministic_flag_is_never_flipped(monkeypatch: pytest.MonkeyPatch) -> None:
    levels = _Levels(monkeypatch)
    for _ in range(3):
        with poisoned_allocations(device="npu:0"):
            _fresh()
    assert levels.level == 2 and not torch.are_deterministic_algorithms_enabled()
    with poisoned_allocations(device="cpu"):  # a CPU's flag is torch's own: switched for the block, restored
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
