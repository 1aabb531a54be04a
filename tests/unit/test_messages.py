"""What failures say on foreign code: rows and columns per rank, replica copies against the bound, gone groups.

Each message is checked as a reader sees it, in the style of
``torch.testing.assert_close``: what was expected, what was seen, and where.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance.contract.equality import describe_difference, wrong_cells
from conformance.contract.layouts import Split, shard
from conformance.contract.results import ObservedCollective, ObservedCollectives, ObservedMatmul
from conformance.judge import assembly, checks
from conformance.judge.group_notes import group_note
from conformance.judge.structure import PartMatmuls, check_phase
from conformance.protocol import OverlapsMatmul
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import NumericMismatch, ReplicaMismatch, StructureMismatch


def test_a_column_split_tensor_names_each_ranks_rows_and_its_own_columns() -> None:
    truth = torch.arange(64 * 96, dtype=torch.float64).reshape(64, 96) / 97
    pieces = [shard(truth, Split.LAST, r, 2).clone() for r in range(2)]
    pieces[0][:, 3:6] += 1.0  # rank 0: every row of three of its columns
    pieces[1][10, 0] += 1.0  # rank 1: one element, its first column (global column 48)
    out = torch.cat(pieces, dim=-1)
    seen = CaseEvidence(kept=True)
    with pytest.raises(NumericMismatch) as raised:
        checks.check_close("dx", out, truth.numpy(), truth.numpy(), (np.abs(truth.numpy()), 1), torch.float32,
                           roundings=1, evidence=seen, split=Split.LAST, tp=2)
    assert [(c.stats.name, failed) for c, failed in seen.comparisons] == [("dx", True)]  # kept for the report
    assert ("on rank 0 rows 0-63, its columns 3-5 of 48 (global 3-5); rank 1 rows 10, its columns 0 of 48 "
            "(global 48)") in str(raised.value)
    assert "every rank" not in str(raised.value)


def test_a_row_split_tensor_names_each_ranks_own_rows_and_columns_when_not_all_are_wrong() -> None:
    wrong = torch.zeros(64, 8, dtype=torch.bool)
    wrong[28:32] = True
    wrong[32:36, 0] = True
    assert wrong_cells(wrong, Split.SEQ, 2) == "rank 0 rows 28-31; rank 1 rows 0-3, columns 0"
    assert wrong_cells(wrong, Split.FULL, 2) == "rows 28-35"
    bias = torch.tensor([0, 1, 1, 0, 0, 0, 1, 0], dtype=torch.bool)
    assert wrong_cells(bias, Split.LAST, 2) == (
        "rank 0 elements 1-2 of 4 (global 1-2); rank 1 elements 2 of 4 (global 6)")


def test_a_bitwise_difference_names_rows_and_columns() -> None:
    a = torch.zeros(4, 6)
    b = a.clone()
    b[1, 4] = 0.5
    assert describe_difference(a, b) == "1 of 24 elements, max |diff| 0.5, rows 1, columns 4"
    assert describe_difference(a, b, Split.LAST, 2) == (
        "1 of 24 elements, max |diff| 0.5, rank 1 rows 1, its columns 1 of 3 (global 4)")


def test_a_replica_mismatch_says_whether_each_copy_is_within_the_bound() -> None:
    truth = torch.ones(2, 3, dtype=torch.float64)
    close = truth.float()
    rounded = torch.nextafter(close, torch.full_like(close, 2.0))
    far = close + 1.0

    def worst_ratio(copy: torch.Tensor) -> float:
        return float((copy.double() - truth).abs().max() / 1e-6)

    with pytest.raises(ReplicaMismatch, match=r"rank 0's copy is within the error bound \(worst \|error\|/bound 0\)"
                       r", rank 1's copy is within the error bound"):
        assembly.check_identical_copies([close, rounded], Split.FULL, "y", worst_ratio)
    outside = r"rank 1's copy is OUTSIDE the error bound \(worst \|error\|/bound 1e\+06\)"
    with pytest.raises(ReplicaMismatch, match=outside):
        assembly.check_identical_copies([close, far], Split.FULL, "y", worst_ratio)
    with pytest.raises(ReplicaMismatch, match="judged against the error bound on its own"):
        assembly.check_identical_copies([close, far], Split.FULL, "y")


def _collective(ranks: tuple[int, ...] | None, state: str = "live") -> ObservedCollective:
    return ObservedCollective("all_reduce", "c10d.allreduce_", None, True, ranks, ((4,),), (), False, state)


def test_collectives_on_a_wrong_a_gone_or_an_unresolved_group_are_named() -> None:
    assert group_note([_collective((0, 1))], (0, 1), "the implementation") == ""
    assert group_note([_collective((0, 1, 2, 3))], (0, 1), "the implementation") == (
        "; the implementation issued collectives on rank group(s) [(0, 1, 2, 3)], not on the TP group [0, 1] "
        "(a collective over the wrong group)")
    gone = group_note([_collective((0, 1), "gone")], (0, 1), "the patched layers")
    assert "process group(s) that no longer existed (destroyed; ranks [(0, 1)] while they existed)" in gone
    unknown = group_note([_collective(None, "unknown")], (0, 1), "the implementation")
    assert "1 collective(s) (['all_reduce']) on a process group whose ranks could not be resolved" in unknown


def _gather_in_flight_while(*matmuls: ObservedMatmul) -> ObservedCollectives:
    return ObservedCollectives((
        ObservedCollective("all_gather", "c10d._allgather_base_", None, True, (0, 1), ((32, 32),), (), False),
        ObservedCollective("all_gather", "c10d._allgather_base_", None, True, (0, 1), ((32, 32),), matmuls, False),
    ))


def test_a_matmul_is_known_by_its_operands_when_its_shape_is_the_weights() -> None:
    # TP 2, 32 tokens per rank, ffn/tp == h_in == 32: the output chunk [32, 32] has the weight's shape
    part = PartMatmuls("w1", (32, 32))
    declared = OverlapsMatmul("output")
    output_chunk = ObservedMatmul((32, 32), frozenset({"w1"}))
    assert check_phase(_gather_in_flight_while(output_chunk), "column/sp/forward", declared, chunks=2,
                       matmuls=part)
    with pytest.raises(StructureMismatch) as raised:
        check_phase(_gather_in_flight_while(ObservedMatmul((32, 32))), "column/sp/forward", declared, chunks=2,
                    matmuls=part)
    assert str(raised.value) == (
        "column/sp/forward: declared one all_gather in flight while the output matmul (the forward product that "
        "reads the weight w1) runs; no such matmul ran while an all_gather was in flight; observed "
        "[all_gather(async), all_gather(async) while mm[32x32]]")
    assert part.named(ObservedMatmul((32, 32), frozenset({"w1"})), "backward") == "input_grad"
    assert part.named(ObservedMatmul((32, 32)), "backward") == "weight_grad"
    assert part.named(ObservedMatmul((64, 32)), "backward") is None


@pytest.mark.parametrize("op, transpose", [("matmul_all_reduce", False), ("matmul_all_reduce", True),
                                           ("matmul_reduce_scatter", True), ("all_gather_matmul", True)])
def test_a_result_of_misread_operands_is_named_by_what_was_misread(op: str, transpose: bool) -> None:
    """A wrong result says what it matches: the bias added on every rank before the reduction, or the weight's
    storage read in its other layout (a fused kernel's transpose flag lost); a result matching neither says
    nothing more."""
    from conformance.contract.jobs import OpRun
    from conformance.contract.problems import Problem, global_operands
    from conformance.judge import op_truth

    tp = 4
    problem = Problem(64, 96, 48, "float32", True)
    run = OpRun(op, (problem,), tp, transpose_weight=transpose)
    t = {k: v.double() if v is not None else None for k, v in global_operands(problem, 0).items()}
    pieces = [shard(t["w"], Split.SEQ if op != "all_gather_matmul" else Split.FULL, r, tp)
              for r in range(tp if op != "all_gather_matmul" else 1)]
    read = [p.T.contiguous().reshape(p.shape) if transpose else p.reshape(p.shape[1], p.shape[0]).T for p in pieces]
    misread = t["x"] @ torch.cat(read) + t["bias"]
    layout = "[n, k] storage read as an ND [k, n] matrix" if transpose else "[k, n] storage read as the transposed"
    assert f"the result matches the weight's {layout}" in op_truth.misread(run, problem, 0, misread)
    bias_tp_times = t["x"] @ t["w"] + tp * t["bias"]
    said = op_truth.misread(run, problem, 0, bias_tp_times)
    assert ("the bias added on each of the 4 ranks before the reduction" in said) == (op != "all_gather_matmul")
    assert op_truth.misread(run, problem, 0, t["x"] @ t["w"] + 2 * t["bias"] + 1) == ""
