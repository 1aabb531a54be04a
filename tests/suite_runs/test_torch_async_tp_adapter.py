"""The torch async-TP adapter (``conformance/adapters/torch_async_tp.py``) against the installed torch.

Async-TP ships with torch, so this runs wherever the tests do: the ops at
TP 2 are green with the shipped expectations (which know only that
async-TP has no CoC configuration), the fused ops pass their MUST checks, and
an op async-TP lacks is skipped, never passed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conformance.record.verdicts import FAILED, outcome_of
from tests.support import ROOT
from tests.support.adapter_runs import OPS_TP2, adapter_run, assert_green
from tests.support.suite_run import SuiteRun

IMPL = "conformance.adapters.torch_async_tp:TorchAsyncTP"
EXPECTATIONS = ROOT / "conformance" / "adapters" / "torch_async_tp.expectations.toml"


def test_ops_at_tp2_are_green(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    run, summary = adapter_run(run_suite, tmp_path, "test_ops", IMPL, *OPS_TP2, "-n", "2",
                               expectations=EXPECTATIONS)
    assert not assert_green(run, summary), "no op case of async-TP is a known failure"
    by_op: dict[str, set[str]] = {}
    for case in summary["cases"]:
        op = case["id"].split("[", 1)[1].split("-", 1)[0] if "[" in case["id"] else ""
        by_op.setdefault(op, set()).add(case["outcome"])
    for op in ("all_gather_matmul", "all_gather_matmul_v2", "matmul_reduce_scatter"):
        assert "passed" in by_op.get(op, ()), (op, by_op.get(op))
    assert by_op.get("matmul_all_reduce") == {"skipped"}, by_op.get("matmul_all_reduce")
    musts = [c for case in summary["cases"] for c in case.get("checks", ()) if c["level"] == "MUST"]
    assert musts and not [c for c in musts if outcome_of(c) == FAILED]
