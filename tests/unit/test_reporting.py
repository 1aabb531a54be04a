"""Allure reporting in process: readable parameter values, no-ops when off, figures, category rules, report build."""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conformance.record import run_diff, runs
from conformance.reporting import allure_cli, baseline, page, plots, quality_gate, same_run, verdict_view
from conformance.reporting import build as report_build
from conformance.reporting import meta as report_meta
from conformance.reporting.allure import attachments, labels, recording, steps


def test_readable_values() -> None:
    import torch

    @dataclass
    class Setting:
        id: str
        argv: list[str]

    assert labels.readable(torch.bfloat16) == "bfloat16"
    assert labels.readable(Setting("cli-over-env", ["--x"])) == "cli-over-env"
    from conformance.judge.hardware import PerfCase

    perf = PerfCase("cpu-gloo", "balanced-ar", "matmul_all_reduce", 64, 64, 64, 2, "float32", {})
    assert labels.readable(perf) == "cpu-gloo/balanced-ar-tp2"  # its name: its id leaves out profile and TP
    assert labels.readable((4096, 8192)) == "4096x8192"
    assert labels.readable([2, 4]) == "[2, 4]"
    long_a, long_b = labels.readable("a" * 100 + "1"), labels.readable("a" * 100 + "2")
    assert len(long_a) <= 80 and long_a != long_b


def test_functions_are_no_ops_when_allure_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not recording.is_active()
    monkeypatch.setattr(plots, "error_histogram", lambda *a, **k: pytest.fail("plotted while inactive"))
    labels.describe_case(feature="f", story="s", device="cpu")
    attachments.attach_comparison(object(), failed=True)  # type: ignore[arg-type]
    attachments.attach_timeline(None, {"mm": [1.0]}, "t")


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
    ("conformance.record.failures.PerfRegression: gain 1% < 3%", "Perf regression"),
    ("conformance.harness.case_errors.RankCrashed: rank 3 died (signal 9)", report_meta.HANG),
    ("conformance.harness.case_errors.RankRaised: rank(s) [0] raised; rank 0: "
     "conformance.record.failures.NumericMismatch: x", "Numeric mismatch"),
    ("conformance.harness.case_errors.RankRaised: rank(s) [0] raised; rank 0: builtins.ValueError: x", None),
    ("AssertionError: NumericMismatch mentioned later", None),
    ("Failed: DID NOT RAISE <class 'Exception'>", "Missing or wrong error"),
])
def test_category_rules(message: str, category: str | None) -> None:
    result = {"status": "failed", "statusDetails": {"message": message + "\n--- rank 0 log ---\nmore"}}
    assert report_meta.matching_category(report_meta.categories(), result["status"],
                                         result["statusDetails"]["message"]) == category
    # a failed case's message starts with its failed checks and their levels: the category is the same
    headed = "[MUST] numerics: failed; [SHOULD] x: failed\n" + message
    assert report_meta.matching_category(report_meta.categories(), "failed", headed) == category


def test_report_config_and_page(tmp_path: Path) -> None:
    config = allure_cli.allure_config(tmp_path, tmp_path / "out", tmp_path / "h.jsonl", "n", 5)
    awesome = config["plugins"]["awesome"]["options"]  # type: ignore[index]
    assert awesome["singleFile"] is True
    assert {"successRateDistribution", "currentStatus"}.isdisjoint(chart["type"] for chart in awesome["charts"])
    assert config["historyPath"] == str(tmp_path / "h.jsonl") and config["appendHistory"] is True
    assert config["categories"] == report_meta.categories()
    assert config["hideLabels"] == ["coc_run", "coc_case"]
    index = tmp_path / "index.html"
    index.write_text('<head></head><body>\n    <script async src="https://www.googletagmanager.com/gtag/js?id=G-X">'
                     "</script>\n    <script>\n        gtag('config', 'G-X', {});\n    </script>\n"
                     '<div id="app"></div></body>')
    page.finish(index, '<section id="coc-verdict">v</section>', "red")
    html = index.read_text()
    assert "googletagmanager" not in html and "URL.createObjectURL" in html.split("</head>")[0]
    assert "passed: " not in html.split("</head>")[0]  # a failed gate's entries stay red
    assert '<body>\n<div id="coc-page"><section id="coc-verdict">v</section><div id="app"></div></div></body>' in html
    index.write_text('<head></head><body><div id="app"></div></body>')
    page.finish(index, "", "green", gate_passed=True)
    assert 'quality-gate-result-rule"]::before{content:"\\2713  passed: "' in index.read_text()
    index.write_text("<head></head><body><main></main></body>")
    with pytest.raises(page.PageError, match="no <div id=\"app\">"):
        page.finish(index, "", "red")
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("not a report")
    with pytest.raises(allure_cli.ReportBuildError, match="not a report directory"):
        allure_cli.prepare_output(other)


def _check(name: str, level: str, outcome: str) -> dict[str, str]:
    return {"name": name, "level": level, "outcome": outcome, "message": f"{name} says why"}


def test_verdict_first_with_the_terminals_table() -> None:
    """The overview's verdict and per-level lines, from the summary, through the terminal's own count."""
    from conformance.record import level_tally
    from conformance.record.levels import Level

    cases = [{"nodeid": "t.py::a", "outcome": "failed",
              "checks": [_check("numerics", "MUST", "passed"), _check("warning", "SHOULD", "failed")]},
             {"nodeid": "t.py::b", "outcome": "not judged", "checks": [_check("perf gate", "MUST", "not judged")]},
             {"nodeid": "t.py::c", "outcome": "not-gated", "checks": [_check("overlap", "STRUCTURE", "failed")]},
             {"nodeid": "t.py::d", "outcome": "passed", "checks": [_check("odd", "SHOULD", "someday")]}]
    summary = {"gate": "must,should", "implementation": "pkg:Impl", "missing": [], "cases": cases,
               "outcomes": {"failed": 1, "not judged": 1, "not-gated": 1, "passed": 1}}
    shown = verdict_view.verdict(summary, {"device": "cpu"})
    assert list(shown) == ["verdict", "MUST", "SHOULD", "STRUCTURE", "implementation", "device", "profile", "cases"]
    assert shown["verdict"] == "NOT CONFORMANT at SHOULD: 1 case(s) failed; conformant at MUST"
    gate = frozenset({Level.MUST, Level.SHOULD})
    counts = level_tally.tally((c for case in cases for c in case["checks"]), gate)
    terminal = {line.split()[0]: line.split(None, 1)[1].strip() for line in level_tally.lines(counts, gate)}
    assert {level: shown[level] for level in terminal} == terminal
    assert " ".join(shown["MUST"].split()) == \
        "1 checks passed, 0 failed, 0 failed but not gated, 1 not judged, 0 not offered (gates: conformant)"
    assert " ".join(shown["STRUCTURE"].split()) == \
        "0 checks passed, 0 failed, 1 failed but not gated, 0 not judged, 0 not offered (not gated)"
    assert "1 someday" in shown["SHOULD"] and shown["SHOULD"].endswith("(gates: NOT CONFORMANT)")
    assert shown["implementation"] == "pkg:Impl" and shown["profile"] == "no perf case ran"
    assert "1 not judged" in shown["cases"]
    text = verdict_view.verdict_markdown(shown, "passed", summary)
    assert all(line in text for line in level_tally.lines(counts, gate)) and "[SHOULD] warning" in text
    assert verdict_view.level_rows(summary)[0] == (
        "MUST", [("passed", 1), ("failed", 0), ("not gated", 0), ("not judged", 1), ("not offered", 0)],
        "conformant")

    judged_ok = {**summary, "gate": "all", "outcomes": {"passed": 2},
                 "cases": [{"outcome": "passed", "checks": [_check("n", "MUST", "passed"), _check("w", "SHOULD",
                                                                                                  "passed")]}]}
    assert verdict_view.verdict(judged_ok, {})["verdict"] == "CONFORMANT at MUST, SHOULD; not judged at STRUCTURE"
    lost = {**judged_ok, "missing": ["t.py::e"]}
    assert verdict_view.verdict(lost, {})["verdict"].startswith("NOT CONFORMANT at MUST, SHOULD, STRUCTURE: 0 case")
    broken = {**judged_ok, "outcomes": {"error": 1}}
    assert verdict_view.verdict(broken, {})["verdict"].startswith("NOT DECIDED")
    assert [verdict_view.run_verdict(s).outcome for s in (summary, judged_ok, lost, broken)] == \
        [level_tally.NOT_CONFORMANT, level_tally.CONFORMANT, level_tally.NOT_CONFORMANT, level_tally.NOT_DECIDED]


def test_a_level_with_no_check_judged_is_never_conformant() -> None:
    """The reviewer's run: MUST failed, SHOULD passed, no STRUCTURE check at all -- STRUCTURE is not judged, in the
    terminal's table and in the verdict alike (one function says what a level comes to)."""
    from collections import Counter

    from conformance.record import level_tally
    from conformance.record.levels import Level

    every = frozenset(Level)
    counts = Counter({("MUST", "passed"): 11, ("MUST", "failed"): 4, ("SHOULD", "passed"): 13})
    assert [level_tally.level_verdict(level, counts, every) for level in Level] == \
        ["NOT CONFORMANT", "conformant", "not judged"]
    assert level_tally.lines(counts, every)[-1].split()[0] == "STRUCTURE"
    assert level_tally.lines(counts, every)[-1].endswith("(gates: not judged)")
    assert level_tally.run_verdict(counts, every, failed_cases=4) == level_tally.RunVerdict(
        level_tally.NOT_CONFORMANT,
        "NOT CONFORMANT at MUST: 4 case(s) failed; conformant at SHOULD; not judged at STRUCTURE")
    assert level_tally.run_verdict(Counter({("MUST", "passed"): 1}), every) == level_tally.RunVerdict(
        level_tally.CONFORMANT, "CONFORMANT at MUST; not judged at SHOULD, STRUCTURE")
    only_not_judged = Counter({("MUST", "not judged"): 3})
    assert level_tally.run_verdict(only_not_judged, every) == level_tally.RunVerdict(
        level_tally.NOT_JUDGED, "NOT JUDGED: no check of MUST, SHOULD, STRUCTURE was judged")
    assert level_tally.run_verdict(Counter(), frozenset({Level.MUST})).headline == \
        "NOT JUDGED: no check of MUST was judged"
    assert level_tally.run_verdict(counts, every, suite_errors=1).outcome == level_tally.NOT_DECIDED
    assert level_tally.level_verdict(Level.SHOULD, counts, frozenset({Level.MUST})) == "not gated"
    assert level_tally.lines(counts, frozenset({Level.MUST}))[-1].endswith("(not gated)")
    assert len(level_tally.lines(Counter(), frozenset({Level.MUST}))) == 1  # ungated empty levels are left out


def test_check_outcomes_as_shown() -> None:
    """A failed check of a known or ungated case says so; only passed checks are passed."""
    failed, not_judged = _check("n", "MUST", "failed"), _check("p", "MUST", "not judged")
    assert steps.check_outcome(failed, "failed") == "failed"
    assert steps.check_outcome(failed, steps.KNOWN) == "known"
    assert steps.check_outcome(failed, steps.NOT_GATED) == "failed, not gated"
    assert steps.check_outcome(not_judged, "passed") == "not judged"
    assert labels.LEVEL_SEVERITY == {"MUST": "critical", "STRUCTURE": "normal", "SHOULD": "minor"}


def test_staged_results_leave_out_fixtures_and_add_the_globals(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "a-result.json").write_text("{}")
    (results / "b-container.json").write_text("{}")
    (results / "coc-summary.json").write_text("{}")
    (results / "coc-summary.jsonl").write_text("")
    staged = tmp_path / "staged"
    report_build.stage_results(results, staged, {"verdict": "# NOT CONFORMANT"},
                               [{"message": "NOT CONFORMANT", "trace": ""}])
    assert sorted(p.name for p in staged.iterdir()) == ["a-result.json", "coc-global-0-attachment.md",
                                                        "coc-run-globals.json"]  # no summary, no container
    globals_ = json.loads((staged / "coc-run-globals.json").read_text())
    assert globals_["attachments"] == [{"name": "verdict", "source": "coc-global-0-attachment.md",
                                        "type": "text/markdown"}]
    assert globals_["errors"][0]["message"] == "NOT CONFORMANT"


def test_the_overview_says_how_many_perf_cases_were_enforced_reported_or_not_run() -> None:
    from conformance.record.report_properties import GATE_ENFORCED, GATE_NOT_RUN, GATE_REPORTED

    def perf_case(gate: str) -> dict[str, object]:
        return {"nodeid": "test_perf.py::x", "outcome": "skipped", "checks": [], "perf_gate": gate}

    def profile(*gates: str) -> str:
        summary = {"gate": "all", "missing": [], "cases": [perf_case(g) for g in gates], "outcomes": {}}
        return verdict_view.verdict(summary, {})["profile"]

    assert profile(GATE_NOT_RUN, GATE_NOT_RUN) == \
        "no perf gate is enforced on this machine: 0 perf case(s) report, 2 not run; not judged"
    assert profile(GATE_REPORTED, GATE_NOT_RUN) == \
        "no perf gate is enforced on this machine: 1 perf case(s) report, 1 not run; not judged"
    assert profile(GATE_ENFORCED, GATE_REPORTED) == "perf gates enforced in 1 of 2 perf case(s)"
    assert profile() == "no perf case ran"


def test_check_tags_one_per_level_and_step_titles() -> None:
    """A level's tag names its worst outcome: never "MUST failed" beside "MUST passed"."""
    checks = [_check("ran", "MUST", "passed"), _check("numerics", "MUST", "failed"), _check("x", "SHOULD", "passed"),
              _check("overlap", "STRUCTURE", "not judged"), _check("y", "STRUCTURE", "passed")]
    assert labels.level_tags(checks) == ["MUST failed", "STRUCTURE not judged", "SHOULD passed"]
    assert labels.level_tags(checks, steps.KNOWN) == ["MUST known", "STRUCTURE not judged", "SHOULD passed"]
    assert steps.check_title(checks[1], "failed") == "[MUST] numerics: failed"


def _result(folder: Path, name: str, status: str, run: str | None, case: str, title: str) -> None:
    labels = [{"name": "epic", "value": "CoC"}, {"name": "coc_case", "value": case}]
    labels += [{"name": "coc_run", "value": run}] if run else []
    (folder / f"{name}-result.json").write_text(json.dumps({"uuid": name, "status": status, "labels": labels,
                                                            "fullName": "m#t", "name": title}))


def test_a_summary_and_results_of_one_run_agree_and_of_two_runs_say_how_they_differ(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    _result(results, "u1", "failed", "run-a", "t.py::a", "h1")
    _result(results, "u2", "skipped", "run-a", "t.py::b", "h2")
    _result(results, "m", "passed", None, "matrix", "hm")  # coc-matrix --alluredir: no run id, no other run
    (results / "environment.properties").write_text("implementation=pkg:Faulty\nrun_id=run-a\n")
    found = same_run.read_results(results)
    assert found.run_ids == {"run-a"} and found.environment["implementation"] == "pkg:Faulty"
    assert found.result_ids["t.py::a"] == hashlib.md5(b"u1").hexdigest()
    assert found.cases_by_title == {("m#t", "h1"): "t.py::a", ("m#t", "h2"): "t.py::b", ("m#t", "hm"): "matrix"}
    assert found.statuses == {"failed": 1, "skipped": 1, "passed": 1, "total": 3}
    assert same_run.disagreements({"run_id": "run-a", "implementation": "pkg:Faulty"}, found) == []
    other = same_run.disagreements({"run_id": "run-b", "implementation": "pkg:Reference"}, found)
    assert other == ["the summary is of run run-b; the results are of run run-a",
                     "the summary judged pkg:Reference; the results judged pkg:Faulty"]
    assert "no run id" in same_run.disagreements({"implementation": "pkg:Faulty"}, found)[0]
    _result(results, "u3", "passed", "run-c", "t.py::c", "h3")  # a second run into the same folder
    mixed = same_run.disagreements({"run_id": "run-a", "implementation": "pkg:Faulty"}, same_run.read_results(results))
    assert mixed and mixed[0].startswith("the results folder holds results of 2 runs (run-a, run-c)")


def test_the_summary_is_found_inside_the_results_first(tmp_path: Path) -> None:
    results = tmp_path / "allure-results"
    results.mkdir()
    assert verdict_view.find_summary(results, None) is None
    (tmp_path / "coc-summary.json").write_text("{}")
    assert verdict_view.find_summary(results, None) == tmp_path / "coc-summary.json"  # an older suite's place
    (results / "coc-summary.json").write_text("{}")
    assert verdict_view.find_summary(results, None) == results / "coc-summary.json"
    assert verdict_view.find_summary(results, tmp_path / "x.json") == tmp_path / "x.json"


def test_quality_gate_results_for_the_tab(tmp_path: Path) -> None:
    said = ("\x1b[31mQuality Gate failed with following issues:\x1b[39m\n\n \x1b[31m⨯\x1b[39m The number of failed "
            "tests \x1b[1m4\x1b[22m exceeds the allowed threshold value \x1b[1m0\x1b[22m    \x1b[90mcoc-conformance/"
            "maxFailures\x1b[39m\n\n\x1b[31m1 quality gate rules have been failed.\x1b[39m")
    failures = quality_gate.failed_rules(said)
    assert failures == [{"rule": "coc-conformance/maxFailures",
                         "message": "The number of failed tests 4 exceeds the allowed threshold value 0"}]
    rules = quality_gate.rules(11)
    assert rules == [{"id": "coc-conformance", "maxFailures": 0, "minTestsCount": 11}]
    failed = quality_gate.GateResult(False, rules, said, failures)
    assert failed.summary == "FAILED: The number of failed tests 4 exceeds the allowed threshold value 0 " \
                             "(coc-conformance/maxFailures)"
    assert quality_gate.report_entries(failed, {}) == [{"success": False, **failures[0]}]
    passed = quality_gate.report_entries(quality_gate.GateResult(True, rules, ""), {"passed": 11, "total": 11})
    assert [(e["success"], e["rule"], e["message"]) for e in passed] == [
        (True, "coc-conformance/maxFailures", "passed: 0 failed or broken result(s), 0 allowed"),
        (True, "coc-conformance/minTestsCount", "passed: 11 result(s), at least 11 expected (the cases collected)")]
    dump = tmp_path / "gate.zip"
    quality_gate.write_dump(dump, passed)
    with zipfile.ZipFile(dump) as archive:
        assert json.loads(archive.read("quality-gate-results.json")) == passed
        assert json.loads(archive.read("test-results.json")) == {} and "global-errors.json" in archive.namelist()


def _case(cid: str, outcome: str, *checks: dict[str, str]) -> dict[str, object]:
    failure = {"category": "numeric mismatch", "message": "NumericMismatch: y | z\nmore"} if outcome == "failed" else {}
    return {"id": cid, "outcome": outcome, "checks": list(checks), **({"failure": failure} if failure else {})}


def test_the_baseline_view_walks_the_gates_sections_case_by_case_and_check_by_check(tmp_path: Path) -> None:
    base = runs.Run("base.json", "pkg:Ref", {
        "t.py::a": _case("t.py::a", "passed", _check("numerics", "MUST", "passed")),
        "t.py::b": _case("t.py::b", "failed", _check("numerics", "MUST", "failed")),
        "t.py::c": _case("t.py::c", "passed", _check("gate", "MUST", "passed"))})
    current = runs.Run("cur.json", "pkg:Patched", {
        "t.py::a": _case("t.py::a", "failed", _check("numerics", "MUST", "failed")),
        "t.py::b": _case("t.py::b", "passed", _check("numerics", "MUST", "passed")),
        "t.py::c": _case("t.py::c", "not judged", _check("gate", "MUST", "not judged"))})
    diff = run_diff.diff_runs(base, current)
    sections = diff.sections
    assert [(s.title, s.red, [row.case for row in s.rows]) for s in sections] == [
        ("New failures", True, ["t.py::a"]), ("Lost judgment (judged in the baseline, not now)", True, ["t.py::c"]),
        ("Fixes", False, ["t.py::b"])]
    assert sections[0].rows[0].cells == ("MUST", "numeric mismatch", "NumericMismatch: y | z")
    assert sections[0].rows[0].changes == ("numerics (MUST): passed -> failed",)
    assert sections[1].rows[0].cells[:4] == ("gate", "MUST", "passed", "not judged")
    assert sections[2].rows[0].changes == ("numerics (MUST): failed -> passed",)
    view = baseline.view(diff, {"t.py::a": "abc"})
    assert view.index("New failures (1)") < view.index("Lost judgment") < view.index("Fixes (1)")
    assert '<a href="#/abc">t.py::a</a>' in view and "NumericMismatch: y | z" in view and 'data-outcome="red"' in view
    assert baseline.summary_line(diff) == "RED: 1 new failures, 1 lost judgment, 1 fixes"
    history = tmp_path / "allure-history.jsonl"
    labelled = {"status": "passed", "labels": [{"name": "coc_case", "value": "t.py::a"}]}
    history.write_text(json.dumps({"testResults": {"h-old": {"status": "broken", "fullName": "m#t"}}}) + "\n" +
                       json.dumps({"testResults": {"h1": labelled, "h2": {"status": "broken", "fullName": "m#t",
                                                                          "name": "B"},
                                                   "h3": {"status": "skipped", "fullName": "m#u", "name": "C"}}}))
    last = baseline.load(history, {("m#t", "B"): "t.py::b"})
    assert {cid: case["outcome"] for cid, case in last.cases.items()} == {"t.py::a": "passed", "t.py::b": "error",
                                                                         "m#u C": "skipped"}
    assert run_diff.check_changes(last.cases["t.py::a"], current.cases["t.py::a"]) == ()  # a history has no checks
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(runs.RunError, match="not an Allure history"):
        baseline.load(tmp_path / "empty.jsonl", {})


def test_the_banner_says_the_verdict_first_coloured_by_outcome() -> None:
    """Coloured by the outcome the record states (never by the headline's words): a headline that reads
    "CONFORMANT" but is another outcome is not green."""
    from conformance.record import level_tally
    from conformance.record.level_tally import RunVerdict

    assert [page.tone(v) for v in (level_tally.CONFORMANT, level_tally.NOT_CONFORMANT, level_tally.NOT_DECIDED,
                                   level_tally.NOT_JUDGED, level_tally.NO_VERDICT, level_tally.NOT_GATED,
                                   "an outcome of a newer record")] == \
        ["green", "red", "red", "amber", "red", "grey", "grey"]
    misleading = page.banner(page.Banner(RunVerdict(level_tally.NOT_DECIDED, "CONFORMANT at MUST (or so it reads)")))
    assert misleading.startswith('<section id="coc-verdict" data-testid="coc-verdict" data-outcome="red">')
    top = page.banner(page.Banner(RunVerdict(level_tally.NOT_CONFORMANT,
                                             "NOT CONFORMANT at MUST: 4 case(s) failed; not judged at STRUCTURE"),
                                  [("MUST", [("passed", 11), ("failed", 4)], "NOT CONFORMANT"),
                                   ("STRUCTURE", [("passed", 0)], "not judged")],
                                  [("gate", "FAILED: 4 failed"), ("implementation", "pkg:Faulty <x>")], False,
                                  [("t.py::perf", "abc"), ("t.py::other", None)], '<div data-testid="coc-baseline">',
                                  ["no baseline view: x"]))
    assert top.startswith('<section id="coc-verdict" data-testid="coc-verdict" data-outcome="red">'
                          '<p class="coc-headline" data-testid="coc-verdict-headline">NOT CONFORMANT at MUST')
    assert top.index('data-testid="coc-baseline"') < top.index('data-testid="coc-levels"')
    assert '<tr data-testid="coc-level" data-outcome="red"><th>MUST</th> <td>11 passed</td> <td>4 failed</td>' in top
    assert '<tr data-testid="coc-level" data-outcome="amber"><th>STRUCTURE</th>' in top
    assert '<p data-testid="coc-fact-gate" data-outcome="red">' in top and "pkg:Faulty &lt;x&gt;" in top
    assert '<a href="#/abc">t.py::perf</a>, t.py::other' in top and "report build: no baseline view: x" in top


@pytest.mark.parametrize("outcomes, shown", [
    (("not judged",), "skipped"), (("not judged", "not offered"), "skipped"),
    (("not judged", "passed"), "passed"), (("not judged", "failed"), "failed")])
def test_a_case_that_judged_nothing_is_shown_skipped_by_the_case_rule(
    monkeypatch: pytest.MonkeyPatch, outcomes: tuple[str, ...], shown: str,
) -> None:
    """Allure shows a case skipped exactly when the summary's rule (case_outcome) calls it not judged."""
    from allure_commons.model2 import Status, TestResult

    result = TestResult(status=Status.FAILED if "failed" in outcomes else Status.PASSED)  # as pytest ended it
    monkeypatch.setattr(recording, "_active", True)
    monkeypatch.setattr(steps, "_open_result", lambda config: result)
    steps.not_judged(None, [_check(f"check {i}", "MUST", o) for i, o in enumerate(outcomes)])  # type: ignore[arg-type]
    assert result.status == shown


def test_checks_carry_the_time_they_took() -> None:
    from conformance.record.levels import Level
    from conformance.record.verdicts import Verdicts

    verdicts = Verdicts()
    with verdicts.check("numerics", Level.MUST):
        time.sleep(0.01)
    assert verdicts.results[0].as_dict()["seconds"] >= 0.01
    verdicts.not_judged("perf", Level.MUST, "no gate here")
    assert "seconds" not in verdicts.results[1].as_dict()


def test_an_incomplete_summary_gives_no_verdict(tmp_path: Path) -> None:
    """The summary of a run killed half way (``complete: false``, written when its session started) is no record
    a verdict rests on, even where its run id is the results'."""
    results = tmp_path / "results"
    results.mkdir()
    _result(results, "u1", "passed", "run-a", "t.py::a", "h1")
    summary = results / "coc-summary.json"
    summary.write_text(json.dumps({"run_id": "run-a", "complete": False, "cases": []}))
    judged = verdict_view.judge_run(results, None, same_run.read_results(results))
    assert judged.summary is None and judged.shown["verdict"].startswith("NO VERDICT: the summary")
    assert judged.verdict.outcome == "NO VERDICT"
    assert "is incomplete" in judged.reasons[0]
    summary.write_text(json.dumps({"run_id": "run-a", "complete": True, "cases": []}))
    assert verdict_view.judge_run(results, None, same_run.read_results(results)).summary is not None
