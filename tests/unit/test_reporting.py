"""Allure reporting in process: readable parameter values, no-ops when off, figures, category rules, report build."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conformance.reporting import allure as reporting
from conformance.reporting import build as report_build
from conformance.reporting import meta as report_meta
from conformance.reporting import plots


def test_readable_values() -> None:
    import torch

    @dataclass
    class Setting:
        id: str
        argv: list[str]

    assert reporting.readable(torch.bfloat16) == "bfloat16"
    assert reporting.readable(Setting("cli-over-env", ["--x"])) == "cli-over-env"
    assert reporting.readable((4096, 8192)) == "4096x8192"
    assert reporting.readable([2, 4]) == "[2, 4]"
    long_a, long_b = reporting.readable("a" * 100 + "1"), reporting.readable("a" * 100 + "2")
    assert len(long_a) <= 80 and long_a != long_b


def test_functions_are_no_ops_when_allure_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not reporting.is_active()
    monkeypatch.setattr(plots, "error_histogram", lambda *a, **k: pytest.fail("plotted while inactive"))
    reporting.describe_case(feature="f", story="s", device="cpu")
    reporting.attach_comparison(object(), failed=True)  # type: ignore[arg-type]
    reporting.attach_timeline(None, {"mm": [1.0]}, "t")


def test_heatmap_view_and_pooling() -> None:
    assert plots.as_matrix(np.zeros(())).shape == (1, 1)
    assert plots.as_matrix(np.zeros(5)).shape == (1, 5)
    assert plots.as_matrix(np.zeros((2, 3, 4))).shape == (6, 4)
    grid = np.zeros((1000, 600))
    grid[999, 0] = 7.0
    pooled, factor = plots._max_pool(grid, 256)
    assert pooled.shape[0] <= 256 and pooled.shape[1] <= 256 and pooled.max() == 7.0
    assert factor == (4, 3)


@pytest.mark.parametrize("message, category", [
    ("conformance.judge.failures.PerfRegression: gain 1% < 3%", "Perf regression"),
    ("conformance.harness.case_errors.RankCrashed: rank 3 died (signal 9)", report_meta.HANG),
    ("conformance.harness.case_errors.RankRaised: rank(s) [0] raised; rank 0: "
     "conformance.judge.failures.NumericMismatch: x", "Numeric mismatch"),
    ("conformance.harness.case_errors.RankRaised: rank(s) [0] raised; rank 0: builtins.ValueError: x", None),
    ("AssertionError: NumericMismatch mentioned later", None),
    ("Failed: DID NOT RAISE <class 'Exception'>", "Missing or wrong error"),
])
def test_category_rules(message: str, category: str | None) -> None:
    result = {"status": "failed", "statusDetails": {"message": message + "\n--- rank 0 log ---\nmore"}}
    assert report_meta.matching_category(report_meta.categories(), result["status"],
                                         result["statusDetails"]["message"]) == category


def test_report_config_and_analytics(tmp_path: Path) -> None:
    config = report_build.allure_config(tmp_path, tmp_path / "out", tmp_path / "h.jsonl", "n", 5)
    assert config["plugins"]["awesome"]["options"]["singleFile"] is True  # type: ignore[index]
    assert config["historyPath"] == str(tmp_path / "h.jsonl") and config["appendHistory"] is True
    assert config["categories"] == report_meta.categories()
    index = tmp_path / "index.html"
    index.write_text('<body>\n    <script async src="https://www.googletagmanager.com/gtag/js?id=G-X"></script>\n'
                     "    <script>\n        gtag('config', 'G-X', {});\n    </script>\n<p>kept</p></body>")
    report_build.strip_analytics(index)
    assert index.read_text() == "<body>\n<p>kept</p></body>"
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("not a report")
    with pytest.raises(report_build.ReportBuildError, match="not a report directory"):
        report_build._prepare_output(other)
