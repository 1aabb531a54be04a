"""The JSON summary says per case which fused kernels ran (docs/DESIGN.md#fused-ops), and the terminal summary
totals them: an implementation reaching kernels registered under torch_npu's names (on the CPU) has them counted in
the cases of those ops and in no other; the reference with ``backend="auto"`` has MC² counted on an NPU node and
nothing anywhere else."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.harness.launchers.devices import detect_device_kind
from tests.support.suite_run import SuiteRun

#: One case of each op, on exact data.
CASES = ("-k", "test_exact_layout and bfloat16 and tp8")
KERNEL_OF = {"matmul_all_reduce": "npu_mm_all_reduce_base", "matmul_reduce_scatter": "npu_mm_reduce_scatter_base",
             "all_gather_matmul": "npu_all_gather_base_mm"}
ON_NPU = detect_device_kind().name == "npu"


def _op(case_id: str) -> str:
    return case_id.split("[", 1)[1].split("-", 1)[0].removesuffix("_v2")


def _run(run_suite: Callable[..., SuiteRun], tmp_path: Path, impl: str) -> tuple[SuiteRun, dict]:
    summary = tmp_path / "summary.json"
    run = run_suite("test_ops", impl, *CASES, "-n", "0", "--coc-summary", str(summary))
    doc = json.loads(summary.read_text())
    assert run.ret == 0 and doc["outcomes"] == {"passed": 4}, run.output
    return run, doc


@pytest.mark.skipif(ON_NPU, reason="defines kernels under torch.ops.npu, which torch_npu owns on an NPU node")
def test_the_fused_kernels_an_implementation_reached_are_counted_per_case(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    run, doc = _run(run_suite, tmp_path, "tests.support.fused_kernel_impl:ReachesNpuNamedKernels")
    for case in doc["cases"]:
        reached = case.get("fused_kernels", {})
        if _op(case["id"]) in ("matmul_all_reduce", "matmul_reduce_scatter"):
            kernel = KERNEL_OF[_op(case["id"])]
            assert set(reached) == {kernel} and reached[kernel] > 0, case
        else:
            assert reached == {}, case
    totals = doc["fused_kernels"]
    assert set(totals) == {"npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base"}
    assert (f"fused kernels the implementation reached, in 2 case(s): npu_mm_all_reduce_base "
            f"{totals['npu_mm_all_reduce_base']}, npu_mm_reduce_scatter_base {totals['npu_mm_reduce_scatter_base']}"
            in run.output), run.output


def test_the_reference_with_auto_reaches_mc2_on_an_npu_node_and_nothing_elsewhere(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """On an NPU node each case counts only its own op's kernel, and MC² ran (these cases' k = 64 is below the
    reduce-scatter and all-gather kernels' range: the all-reduce takes them on Atlas A2)."""
    _, doc = _run(run_suite, tmp_path, "coc_impl.reference:ReferenceCoCAuto")
    for case in doc["cases"]:
        assert set(case.get("fused_kernels", {})) <= ({KERNEL_OF[_op(case["id"])]} if ON_NPU else set()), case
    assert bool(doc["fused_kernels"]) == ON_NPU, doc["fused_kernels"]
