"""Which fused backend ran (docs/DESIGN.md#fused-ops): the probes count every call of torch_npu's fused kernels
(MC²) an implementation's calls reach, per rank, and a case's record keeps the most any rank made, per kernel.

No NPU here: the rank task registers a CPU kernel under torch_npu's namespace and name, on ranks of its own."""

from __future__ import annotations

from coc_impl.backends import npu_runtime
from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.harness.probes.recording_mode import FUSED_KERNEL_NAMESPACE, FUSED_KERNELS
from conformance.harness.runner import CaseTimings, RankRunner
from conformance.plugins.time_breakdown import describe_fused_by_op, fused_kernels_by_op
from tests.support import rank_cases

IMPL = "coc_impl.reference:ReferenceCoC"


def test_a_case_records_the_fused_kernels_its_implementation_reached_per_rank() -> None:
    launcher = ProcessLauncher(cpu(2), max_live_ranks=2)
    try:
        timings = CaseTimings()
        ranks = RankRunner(launcher, None, IMPL).for_case(timings)
        outcomes = ranks.outcomes(rank_cases.calls_npu_named_kernels, 2, calls=3)
        assert [o.error for o in outcomes] == [None, None]
        # Only the calls inside the recording, only the fused kernel, only in torch_npu's namespace.
        assert [o.fused_kernels for o in outcomes] == [{"npu_mm_all_reduce_base": 3}, {"npu_mm_all_reduce_base": 4}]
        ranks.outcomes(rank_cases.calls_npu_named_kernels, 2, calls=1)
        assert timings.fused_kernels == {"npu_mm_all_reduce_base": 4 + 2}  # the busiest rank's, over the runs
        assert "fused_kernels" not in timings.as_dict()  # reported apart from the timings
    finally:
        launcher.close()


def test_the_kernels_counted_include_every_one_the_reference_binds() -> None:
    assert FUSED_KERNEL_NAMESPACE == "npu" and set(npu_runtime.MC2_OPS) <= FUSED_KERNELS


def test_per_fused_op_the_cases_that_reached_a_fused_kernel_and_their_calls() -> None:
    """What an NPU run says per fused op: how many of its cases reached MC², with how many calls; an op whose cases
    reached none says so (it never ran fused), and no layer or sequence case is counted under an op."""
    cases = [("op:matmul_all_reduce", {"npu_mm_all_reduce_base": 2}), ("op:matmul_all_reduce", {}),
             ("op:matmul_all_reduce/w8a16", {"npu_mm_all_reduce_base": 1}), ("op:matmul_reduce_scatter", {}),
             ("op:all_gather_matmul_v2", {"npu_all_gather_base_mm": 3}), ("op:sequence", {"npu_all_gather_base_mm": 1}),
             ("layer:row", {"npu_mm_all_reduce_base": 5}), (None, {})]
    by_op = fused_kernels_by_op(cases)
    assert by_op == {
        "all_gather_matmul_v2": {"cases": 1, "reached": 1, "calls": {"npu_all_gather_base_mm": 3}},
        "matmul_all_reduce": {"cases": 3, "reached": 2, "calls": {"npu_mm_all_reduce_base": 3}},
        "matmul_reduce_scatter": {"cases": 1, "reached": 0, "calls": {}},
    }
    assert describe_fused_by_op(by_op) == (
        "all_gather_matmul_v2 npu_all_gather_base_mm 3 in 1 of 1 case(s); "
        "matmul_all_reduce npu_mm_all_reduce_base 3 in 2 of 3 case(s); matmul_reduce_scatter none in 1 case(s)")
