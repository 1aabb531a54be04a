"""Which fused backend ran (docs/DESIGN.md#fused-ops): the probes count every call of torch_npu's fused kernels
(MC²) an implementation's calls reach, per rank, and a case's record keeps the most any rank made, per kernel.

No NPU here: the rank task registers a CPU kernel under torch_npu's namespace and name, on ranks of its own."""

from __future__ import annotations

from coc_impl.backends import ascend
from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.harness.probes import FUSED_KERNEL_NAMESPACE, FUSED_KERNELS
from conformance.harness.runner import CaseTimings, RankRunner
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
    assert FUSED_KERNEL_NAMESPACE == "npu" and set(ascend.MC2_OPS) <= FUSED_KERNELS
