"""CI gating in process: baseline comparison, the gate command, expectations files, the matrix, CI templates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance.gating import expectations, gate, matrix
from tests.support import ROOT


def _perf_case(gain: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    gains = [round(float(g), 5) for g in rng.normal(gain, 0.01, size=12)]
    return {"id": "test_perf.py::test_coc_gain_meets_profile[cpu-gloo/balanced-rs-tp2]", "area": "perf",
            "outcome": "passed", "checks": [{"name": "gate", "level": "MUST", "passed": True}],
            "perf": {"variants": {"scripted-4": {"gain_paired": float(np.median(gains)), "paired_gains": gains}}}}


def _summary(tmp_path: Path, name: str, cases: list[dict[str, Any]]) -> Path:
    path = tmp_path / name / "coc-summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"implementation": "x:Y", "cases": cases}))
    return path.parent


def _numeric(outcome: str) -> dict[str, Any]:
    case = {"id": "test_ops.py::test_op_matches_golden[matmul_all_reduce-op-m64-float32-tp2]", "area": "ops",
            "outcome": outcome, "checks": [{"name": "numerics", "level": "MUST", "passed": outcome == "passed"}]}
    if outcome == "failed":
        case["failure"] = {"category": "numeric mismatch", "message": "NumericMismatch: y [...] violations=12"}
    return case


def test_gate_is_red_on_a_numeric_failure_and_a_clearly_slower_coc(tmp_path: Path) -> None:
    baseline = _summary(tmp_path, "base", [_numeric("passed"), _perf_case(0.20, 1)])
    current = _summary(tmp_path, "cur", [_numeric("failed"), _perf_case(0.10, 2)])
    result = gate.diff_runs(gate.load_run(baseline), gate.load_run(current))
    text = gate.markdown(result)
    assert result.red
    assert [c["id"] for c in result.new_failures] == [_numeric("failed")["id"]]
    (regression,) = result.perf_regressions
    assert regression.clear and regression.change == pytest.approx(-0.10, abs=0.02)
    assert "New failures (1)" in text and "Perf regressions (1)" in text and "| clear |" in text


def test_gate_is_green_over_two_clean_runs_and_says_when_a_drop_is_noise(tmp_path: Path) -> None:
    baseline = _summary(tmp_path, "base", [_numeric("passed"), _perf_case(0.20, 1)])
    current = _summary(tmp_path, "cur", [_numeric("passed"), _perf_case(0.20, 2)])
    assert not gate.diff_runs(gate.load_run(baseline), gate.load_run(current)).red
    noisy = _perf_case(0.16, 3)
    noisy["perf"]["variants"]["scripted-4"]["paired_gains"] = [0.16 + 0.2 * (-1) ** i for i in range(12)]
    result = gate.diff_runs(gate.load_run(baseline), gate.load_run(_summary(tmp_path, "noisy", [noisy])))
    (change,) = result.perf_regressions
    assert not change.clear and change.verdict.startswith("within the noise") and not result.red


def test_gate_command_exit_codes(tmp_path: Path) -> None:
    baseline = _summary(tmp_path, "base", [_numeric("passed")])
    current = _summary(tmp_path, "cur", [_numeric("failed")])

    def gate(*args: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "conformance.gating.gate", "--baseline", str(args[0]), "--current",
                               str(args[1]), "--out", str(tmp_path / "gate.md")], cwd=ROOT, capture_output=True,
                              text=True)

    assert gate(baseline, baseline).returncode == 0
    red = gate(baseline, current)
    assert red.returncode == 1 and "## coc-conformance gate: RED" in red.stdout
    assert (tmp_path / "gate.md").read_text() == red.stdout
    assert gate(baseline, tmp_path / "nowhere").returncode == 2


def test_expectations_file_is_validated(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[expect]]\npattern = "x"\noutcome = "flaky"\nreason = "r"\n')
    with pytest.raises(expectations.ExpectationsError, match="outcome must be one of"):
        expectations.Expectations.load(bad)


def test_matrix_counts_checks_by_area_and_level() -> None:
    cases = [
        {"area": "ops", "outcome": "passed", "checks": [{"level": "MUST", "passed": True}]},
        {"area": "ops", "outcome": "known", "checks": [{"level": "MUST", "passed": True},
                                                       {"level": "SHOULD", "passed": False}]},
        {"area": "layers", "outcome": "failed", "checks": []},
        {"area": "layers", "outcome": "failed", "checks": [{"level": "STRUCTURE", "passed": False}]},
    ]
    counts = matrix.tally(cases)
    assert counts[("ops", "MUST", "pass")] == 2 and counts[("ops", "SHOULD", "known")] == 1
    assert counts[("layers", "MUST", "fail")] == 1 and counts[("layers", "STRUCTURE", "fail")] == 1
    table = matrix.markdown({"reference": cases})
    assert "| reference | 2 / 0 / 0 | 0 / 1 / 0 |" in table


TEMPLATES = ROOT / "ci-templates"


@pytest.mark.parametrize("name", ["github-actions.yml", "gitlab-ci.yml"])
def test_ci_templates_parse_and_gate(name: str) -> None:
    yaml = pytest.importorskip("yaml")
    text = (TEMPLATES / name).read_text()
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict) and doc
    for step in ("-m smoke", "--coc-expectations", "--coc-summary", "--junitxml", "coc-gate",
                 "--baseline", "--current"):
        assert step in text, f"{name} lacks {step!r}"
