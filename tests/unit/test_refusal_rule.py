"""The one refusal rule of op cases (``judge/op_verdicts.sort_refusals``), as the explorer and the corpus judge by it.

The fixed suite's side is proven by the proof table (``NoGatherZeroScatter``, ``OffersNoGather``); here the
explorer's judging of a sequence whose first op is not offered: its other op is judged all the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.explore import op_calls
from conformance.explore.kind import Scope
from conformance.explore.op_spec import Call, OpSpec
from conformance.harness.runner import CaseTimings
from conformance.protocol import declarations
from conformance.record.levels import Level
from conformance.record.verdicts import NOT_OFFERED, Verdicts

#: A gather, then a reduce-scatter of the same shape (a sequence, as the fixed suite's corner runs it).
SEQUENCE = OpSpec((Call(64, 64, 32, op="all_gather_matmul"), Call(64, 64, 32, op="matmul_reduce_scatter")), tp=2)


def _judged(pool: Any, fault: str) -> tuple[Any, Verdicts]:
    from conformance.harness.runner import RankRunner
    from tests.support import faulty_impls

    impl = getattr(faulty_impls, fault)()
    ranks = RankRunner(pool, None, f"tests.support.faulty_impls:{fault}").for_case(CaseTimings())
    verdicts = Verdicts()
    scope = Scope.of(impl, declarations(impl), megatron="not drawn here")
    return op_calls.judge_spec(ranks, SEQUENCE, scope, verdicts), verdicts


@pytest.mark.parametrize("fault, failed", [("NoGatherZeroScatter", {("numerics", Level.MUST)}),
                                           ("OffersNoGather", set())])
def test_one_op_of_a_sequence_not_offered_leaves_the_other_judged(pool: Any, fault: str,
                                                                  failed: set[tuple[str, Level]]) -> None:
    judged, verdicts = _judged(pool, fault)
    assert {(k.check, k.level) for k, _ in judged.failures} == failed, judged
    assert ("the op ran on every rank", Level.MUST) in {(k.check, k.level) for k in judged.judged}, judged
    assert "all_gather_matmul" in judged.not_offered and "matmul_reduce_scatter" not in judged.not_offered, judged
    assert judged.skipped.startswith("not implemented: no all-gather ops"), judged
    [record] = [r for r in verdicts.results if r.outcome == NOT_OFFERED]
    assert record.message.startswith("all_gather_matmul: not implemented"), record
