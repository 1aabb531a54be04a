"""The suite on the emulated 8-NPU node (npu-sim, ``--coc-emulate-npu``; docs/DESIGN.md#the-emulated-npu-node): hccl
ranks, one per card, torch_npu's MC2 kernels under the reference with ``backend="auto"`` -- what a user's NPU node
runs, on the CPU.  Each test is a first contact the node found, asserted on the run's JSON summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.protocol import FUSED_OPS
from tests.support.suite_run import SuiteRun

AUTO = "coc_impl.reference:ReferenceCoCAuto"
#: The kernel each fused op runs on (torch_npu 2.13's MC2 binding, coc_impl/backends/ascend.py).
MC2_KERNEL = {"matmul_all_reduce": "npu_mm_all_reduce_base", "matmul_reduce_scatter": "npu_mm_reduce_scatter_base",
              "all_gather_matmul": "npu_all_gather_base_mm", "all_gather_matmul_v2": "npu_all_gather_base_mm"}


def _summary(run: SuiteRun, path: Path) -> dict[str, Any]:
    assert path.is_file(), f"no summary written:\n{run.output[-3000:]}"
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_every_fused_op_runs_on_mc2_where_its_kernel_takes_the_call(run_suite_on_npus: Callable[..., SuiteRun],
                                                                  tmp_path: Path) -> None:
    """The golden cases inside the MC2 kernels' documented domain (half precision, k >= 256, at TP 2, 4 and 8)
    reach each op's kernel at every TP size, and the summary says so per op."""
    summary = tmp_path / "summary.json"
    run = run_suite_on_npus("test_ops", AUTO, "-k", "op_matches_golden and not wT and (k512n64 or k2048 or k256n64)",
                            "--coc-summary", str(summary))
    doc = _summary(run, summary)
    assert run.ret == 0 and doc["outcomes"] == {"passed": 12}, run.output[-3000:]
    by_op = doc["fused_kernels_by_op"]
    assert set(by_op) == set(FUSED_OPS), by_op
    for op, entry in by_op.items():
        assert entry["reached"] == entry["cases"] == 3 and set(entry["calls"]) == {MC2_KERNEL[op]}, (op, entry)
    for case in doc["cases"]:
        assert case["capability"].startswith("op:") and case["fused_kernels"], case
    assert "fused kernels by op: all_gather_matmul npu_all_gather_base_mm 3 in 3 of 3 case(s)" in run.output


def test_a_layers_default_mode_on_arrival_order_reductions_is_not_judged_for_determinism(
        run_suite_on_npus: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """HCCL reduces in arrival order unless HCCL_DETERMINISTIC asks otherwise: a layer's default mode cannot be
    judged bitwise reproducible there (it failed the reference on every layer case); with it set, it is."""
    select = ("-k", "layer_is_deterministic and row-nosp and float32")
    for environ, outcome in (({}, "not judged"), ({"HCCL_DETERMINISTIC": "true"}, "passed")):
        summary = tmp_path / f"summary-{outcome}.json"
        run = run_suite_on_npus("test_layers", AUTO, *select, "--coc-summary", str(summary), environ=environ)
        cases = _summary(run, summary)["cases"]
        assert run.ret == 0 and len(cases) == 1 and cases[0]["outcome"] == outcome, run.output[-3000:]
        check = cases[0]["checks"][0]
        assert check["name"] == "test_layer_is_deterministic" and check["outcome"] == outcome, check
        if outcome == "not judged":
            assert "HCCL_DETERMINISTIC is true or strict (unset here)" in check["message"], check


def test_the_measured_chunk_count_runs_on_the_layers_device(run_suite_on_npus: Callable[..., SuiteRun],
                                                            tmp_path: Path) -> None:
    """``parallel_num auto`` measures with the layer's NPU tensors over its HCCL group (it measured CPU tensors)."""
    summary = tmp_path / "summary.json"
    run = run_suite_on_npus("test_layers", AUTO, "-k", "auto_chunk_count and row-nosp", "--coc-summary",
                            str(summary))
    doc = _summary(run, summary)
    assert run.ret == 0 and doc["outcomes"] == {"passed": 1}, run.output[-3000:]
