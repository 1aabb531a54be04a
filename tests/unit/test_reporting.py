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


def _check(name: str, level: str, outcome: str) -> dict[str, str]:
    return {"name": name, "level": level, "outcome": outcome, "message": f"{name} says why"}


def test_verdict_first_with_the_terminals_table() -> None:
    """The overview's verdict and per-level lines, from the summary, through the terminal's own count."""
    from conformance.judge import level_tally
    from conformance.judge.levels import Level

    cases = [{"nodeid": "t.py::a", "outcome": "failed",
              "checks": [_check("numerics", "MUST", "passed"), _check("warning", "SHOULD", "failed")]},
             {"nodeid": "t.py::b", "outcome": "not judged", "checks": [_check("perf gate", "MUST", "not judged")]},
             {"nodeid": "t.py::c", "outcome": "not-gated", "checks": [_check("overlap", "STRUCTURE", "failed")]},
             {"nodeid": "t.py::d", "outcome": "passed", "checks": [_check("odd", "SHOULD", "someday")]}]
    summary = {"gate": "must,should", "implementation": "pkg:Impl", "missing": [], "cases": cases,
               "outcomes": {"failed": 1, "not judged": 1, "not-gated": 1, "passed": 1}}
    shown = report_build.verdict(summary, {"device": "cpu"})
    assert list(shown) == ["verdict", "MUST", "SHOULD", "STRUCTURE", "implementation", "device", "profile", "cases"]
    assert shown["verdict"] == "NOT CONFORMANT at MUST, SHOULD: 1 case(s) failed a gated check"
    gate = frozenset({Level.MUST, Level.SHOULD})
    counts = level_tally.tally((c for case in cases for c in case["checks"]), gate)
    terminal = {line.split()[0]: line.split(None, 1)[1].strip() for line in level_tally.lines(counts, gate)}
    assert {level: shown[level] for level in terminal} == terminal
    assert " ".join(shown["MUST"].split()) == \
        "1 checks passed, 0 failed, 0 failed but not gated, 1 not judged, 0 not offered (gates)"
    assert " ".join(shown["STRUCTURE"].split()) == \
        "0 checks passed, 0 failed, 1 failed but not gated, 0 not judged, 0 not offered (not gated)"
    assert "1 someday" in shown["SHOULD"]  # an outcome the table does not know is shown by its name
    assert shown["implementation"] == "pkg:Impl" and shown["profile"] == "no perf case ran"
    assert "1 not judged" in shown["cases"]
    text = report_build.verdict_markdown(shown, "passed", summary)
    assert all(line in text for line in level_tally.lines(counts, gate)) and "[SHOULD] warning" in text

    passing = {**summary, "gate": "all", "outcomes": {"passed": 4}, "cases": cases[1:]}
    assert report_build.verdict(passing, {})["verdict"] == "CONFORMANT at MUST, SHOULD, STRUCTURE"
    lost = {**passing, "missing": ["t.py::e"]}
    assert report_build.verdict(lost, {})["verdict"].startswith("NOT CONFORMANT")
    broken = {**passing, "outcomes": {"error": 1}}
    assert report_build.verdict(broken, {})["verdict"].startswith("NOT DECIDED")


def test_check_outcomes_as_shown() -> None:
    """A failed check of a known or ungated case says so; only passed checks are passed."""
    failed, not_judged = _check("n", "MUST", "failed"), _check("p", "MUST", "not judged")
    assert reporting.check_outcome(failed, "failed") == "failed"
    assert reporting.check_outcome(failed, reporting.KNOWN) == "known"
    assert reporting.check_outcome(failed, reporting.NOT_GATED) == "failed, not gated"
    assert reporting.check_outcome(not_judged, "passed") == "not judged"
    assert reporting.LEVEL_SEVERITY == {"MUST": "critical", "STRUCTURE": "normal", "SHOULD": "minor"}


def test_staged_results_leave_out_fixtures_and_add_the_globals(tmp_path: Path) -> None:
    import json

    results = tmp_path / "results"
    results.mkdir()
    (results / "a-result.json").write_text("{}")
    (results / "b-container.json").write_text("{}")
    staged = tmp_path / "staged"
    report_build.stage_results(results, staged, {"verdict": "# NOT CONFORMANT"},
                               [{"message": "NOT CONFORMANT", "trace": ""}])
    assert sorted(p.name for p in staged.iterdir()) == ["a-result.json", "coc-global-0-attachment.md",
                                                        "coc-run-globals.json"]
    globals_ = json.loads((staged / "coc-run-globals.json").read_text())
    assert globals_["attachments"] == [{"name": "verdict", "source": "coc-global-0-attachment.md",
                                        "type": "text/markdown"}]
    assert globals_["errors"][0]["message"] == "NOT CONFORMANT"


def test_the_overview_says_how_many_perf_cases_were_enforced_reported_or_not_run() -> None:
    from conformance.report_properties import GATE_ENFORCED, GATE_NOT_RUN, GATE_REPORTED

    def perf_case(gate: str) -> dict[str, object]:
        return {"nodeid": "test_perf.py::x", "outcome": "skipped", "checks": [], "perf_gate": gate}

    def profile(*gates: str) -> str:
        summary = {"gate": "all", "missing": [], "cases": [perf_case(g) for g in gates], "outcomes": {}}
        return report_build.verdict(summary, {})["profile"]

    assert profile(GATE_NOT_RUN, GATE_NOT_RUN) == \
        "no perf gate is enforced on this machine: 0 perf case(s) report, 2 not run; not judged"
    assert profile(GATE_REPORTED, GATE_NOT_RUN) == \
        "no perf gate is enforced on this machine: 1 perf case(s) report, 1 not run; not judged"
    assert profile(GATE_ENFORCED, GATE_REPORTED) == "perf gates enforced in 1 of 2 perf case(s)"
    assert profile() == "no perf case ran"
