"""The one reading of what a case needs of the node (``conformance.caseids.needs``,
docs/DESIGN.md#leases-and-node-size): TP sizes, world and exclusivity, from the case's parameters."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from conformance.caseids import Needs, needs
from conformance.judge import hardware


def _item(params: dict[str, Any], *markers: str) -> Any:
    return SimpleNamespace(callspec=SimpleNamespace(params=params),
                           get_closest_marker=lambda name: object() if name in markers else None)


@pytest.mark.parametrize("params, markers, expected", [
    ({"tp": 2, "op": "matmul_all_reduce"}, (), Needs(frozenset({2}), 2, False)),
    ({"world_size": 8, "bad": "mc2"}, (), Needs(frozenset({8}), 8, False)),
    ({"tp": 2, "world": 4}, (), Needs(frozenset({2}), 4, False)),
    ({"flag": True, "name": "x"}, (), Needs(frozenset(), 0, False)),
    ({"case": hardware.by_name("cpu-gloo").cases[0]}, ("perf",), Needs(frozenset({2}), 2, True)),
    ({"case": hardware.by_name("npu-910b-tp8").cases[0]}, ("perf",), Needs(frozenset({8}), 8, True)),
])
def test_needs_reads_tp_world_and_exclusivity(params: dict[str, Any], markers: tuple[str, ...],
                                               expected: Needs) -> None:
    assert needs(_item(params, *markers)) == expected


def test_a_shortfall_names_both_counts() -> None:
    need = Needs(frozenset({2}), 2, True)
    assert need.shortfall(1) == "needs 2 devices, this node has 1"
    assert need.shortfall(2) is None and Needs(frozenset(), 0, False).shortfall(0) is None
