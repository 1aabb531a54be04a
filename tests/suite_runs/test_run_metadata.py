"""A run records what its determinism verdicts depended on (docs/DESIGN.md#fused-ops): the variables that decide
reduction orders and GEMM modes (``HCCL_DETERMINISTIC`` and the like) and torch's switches, in the JSON summary and
the Allure environment."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.reporting.meta import DETERMINISM_VARIABLES
from tests.support.suite_run import SuiteRun


def test_a_run_records_the_settings_its_determinism_depended_on(
        run_suite: Callable[..., SuiteRun], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    summary, results = tmp_path / "summary.json", tmp_path / "allure-results"
    run = run_suite("test_ops", "coc_impl.reference:ReferenceCoC", "-k", "test_exact_layout and bfloat16 and tp2 and "
                    "matmul_all_reduce", "-n", "0", "--coc-summary", str(summary), f"--alluredir={results}")
    assert run.ret == 0, run.output
    recorded = json.loads(summary.read_text())["determinism"]
    assert set(DETERMINISM_VARIABLES) <= set(recorded)
    assert recorded["HCCL_DETERMINISTIC"] == "true" and recorded["CUBLAS_WORKSPACE_CONFIG"] is None
    assert recorded["torch.use_deterministic_algorithms"] == "off"
    environment = (results / "environment.properties").read_text().splitlines()
    assert "HCCL_DETERMINISTIC=true" in environment and "torch.use_deterministic_algorithms=off" in environment
    assert not any(line.startswith("CUBLAS_WORKSPACE_CONFIG") for line in environment)
