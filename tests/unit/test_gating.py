"""CI gating in process: baseline comparison, the gate command, expectations files, the matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance.gating import expectations, gate, matrix
from conformance.record import run_diff, runs
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
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current))
    text = gate.markdown(result)
    assert result.red
    assert [c["id"] for c in result.new_failures] == [_numeric("failed")["id"]]
    (regression,) = result.perf_regressions
    assert regression.clear and regression.change == pytest.approx(-0.10, abs=0.02)
    assert "New failures (1)" in text and "Perf regressions (1)" in text and "| clear |" in text


def test_gate_is_green_over_two_clean_runs_and_says_when_a_drop_is_noise(tmp_path: Path) -> None:
    baseline = _summary(tmp_path, "base", [_numeric("passed"), _perf_case(0.20, 1)])
    current = _summary(tmp_path, "cur", [_numeric("passed"), _perf_case(0.20, 2)])
    assert not run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current)).red
    noisy = _perf_case(0.16, 3)
    noisy["perf"]["variants"]["scripted-4"]["paired_gains"] = [0.16 + 0.2 * (-1) ** i for i in range(12)]
    result = run_diff.diff_runs(runs.load_run(baseline),
                                runs.load_run(_summary(tmp_path, "noisy", [_numeric("passed"), noisy])))
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
        {"area": "layers", "outcome": "error", "failure": {"category": "suite error"}},
    ]
    counts = matrix.tally(cases)
    assert counts[("ops", "MUST", "pass")] == 2 and counts[("ops", "SHOULD", "known")] == 1
    assert counts[("layers", "MUST", "fail")] == 1 and counts[("layers", "STRUCTURE", "fail")] == 1
    assert sum(counts.values()) == 5  # the suite's own error counts for no implementation
    table = matrix.markdown({"reference": cases})
    assert "| reference | fails 2 check(s) | 2 / 0 / 0 / 0 / 0 | 0 / 1 / 0 / 0 / 0 |" in table


def test_matrix_shows_not_judged_apart_from_passed() -> None:
    cases = [{"area": "layers", "outcome": "passed", "checks": [
        {"level": "STRUCTURE", "passed": False, "outcome": "not judged"},
        {"level": "STRUCTURE", "passed": True, "outcome": "passed"}]}]
    counts = matrix.tally(cases)
    assert counts[("layers", "STRUCTURE", "pass")] == 1 and counts[("layers", "STRUCTURE", "not judged")] == 1
    assert "| reference | passes what it was judged on | 1 / 0 / 0 / 1 / 0 |" in matrix.markdown({"reference": cases})


def test_a_run_that_judged_nothing_is_never_shown_conformant() -> None:
    """Every case skipped as not offered: the matrix counts them, and says the run judged nothing."""
    offered_none = [{"area": "ops", "outcome": "skipped", "skip_reason": "not implemented: no fused ops",
                     "checks": [{"name": "test_op", "level": "MUST", "passed": False, "outcome": "not offered"}]},
                    {"area": "layers", "outcome": "not judged", "checks": [
                        {"name": "overlap structure", "level": "STRUCTURE", "passed": False,
                         "outcome": "not judged"}]}]
    counts = matrix.tally(offered_none)
    assert counts == {("ops", "MUST", "not offered"): 1, ("layers", "STRUCTURE", "not judged"): 1}
    table = matrix.markdown({"offers-nothing": offered_none, "skips-everything": [
        {"area": "ops", "outcome": "skipped", "skip_reason": "needs 8 ranks"}]})
    assert "| offers-nothing | judged nothing | 0 / 0 / 0 / 0 / 1 | 0 / 0 / 0 / 1 / 0 |" in table, table
    assert "| skips-everything | judged nothing | 0 / 0 / 0 / 0 / 0 | 0 / 0 / 0 / 0 / 0 |" in table, table


def test_gate_reads_unexpected_passes_and_every_hang_class_from_the_summary(tmp_path: Path) -> None:
    passed = _numeric("passed")
    unexpected = {**passed, "outcome": "failed", "failure": {
        "category": "unexpected pass", "type": "UnexpectedPass", "message": "unexpected pass: ..."}}
    storm = {**passed, "id": passed["id"] + "-storm", "outcome": "failed", "failure": {
        "category": "hang", "type": "StormBroken", "message": "StormBroken: not run"}}
    path = tmp_path / "cur.json"
    path.write_text(json.dumps({"cases": [unexpected, storm], "missing": ["suite/test_ops.py::test_lost[x]"]}))
    result = run_diff.diff_runs(runs.load_run(_summary(tmp_path, "base", [passed])), runs.load_run(path))
    assert [c["id"] for c in result.unexpected_passes] == [passed["id"]]
    assert sorted(c["id"] for c in result.hangs) == sorted([storm["id"], "test_ops.py::test_lost[x]"])
    assert result.red and not result.new_failures


@pytest.mark.parametrize("message, kind", [
    ("StormBroken: not run: 3 hangs in a row", "hangs"), ("WorkerLost: no result", "hangs"),
    ("CaseTimeout: did not finish", "hangs"), ("RankCrashed: rank 1 died", "hangs"),
    ("unexpected pass: test_x was expected to fail", "unexpected_passes")])
def test_gate_reads_hangs_and_unexpected_passes_from_allure(tmp_path: Path, message: str, kind: str) -> None:
    allure = tmp_path / "allure"
    allure.mkdir()
    (allure / "a-result.json").write_text(json.dumps({"fullName": "suite.test_x", "status": "failed",
                                                      "statusDetails": {"message": message}}))
    result = run_diff.diff_runs(runs.Run("b", "?", {}), runs.load_run(allure))
    assert len(getattr(result, kind)) == 1 and not result.new_failures


def test_an_allure_results_folder_names_its_cases_as_the_summary_does(tmp_path: Path) -> None:
    """A baseline of Allure results beside a current summary: the same passed case is no change, not a loss."""
    passed = _numeric("passed")
    allure = tmp_path / "allure"
    allure.mkdir()
    (allure / "a-result.json").write_text(json.dumps({
        "fullName": "conformance.suite.test_ops#test_op_matches_golden", "status": "passed",
        "parameters": [{"name": "tp", "value": "2"}], "labels": [{"name": "coc_case", "value": passed["id"]}]}))
    result = run_diff.diff_runs(runs.load_run(allure), runs.load_run(_summary(tmp_path, "cur", [passed])))
    assert not result.red and not result.sections, [s.title for s in result.sections]


def _check(name: str, level: str, passed: bool) -> dict[str, Any]:
    return {"name": name, "level": level, "passed": passed, "outcome": "passed" if passed else "failed"}


def test_a_known_check_failure_never_hides_another_checks_failure() -> None:
    known = expectations.Expectations.parse({"expect": [
        {"pattern": "test_x.py::*", "check": "declared error type", "outcome": "fail", "reason": "untyped"}]})
    entries = known.matching("test_x.py::test_a[p]")
    alone = expectations.judge_checks(entries, [_check("declared error type", "SHOULD", False),
                                                _check("numerics", "MUST", True)], hung=False)
    assert [c["name"] for c, _ in alone.known] == ["declared error type"] and not alone.new
    both = expectations.judge_checks(entries, [_check("declared error type", "SHOULD", False),
                                               _check("numerics", "MUST", False)], hung=False)
    assert [c["name"] for c in both.new] == ["numerics"]
    fixed = expectations.judge_checks(entries, [_check("declared error type", "SHOULD", True)], hung=False)
    assert [c["name"] for c, _ in fixed.unexpected_passes] == ["declared error type"]
    assert known.match("test_x.py::test_a[p]") is None  # no whole-case entry


def test_expectations_writer_writes_one_entry_per_failed_check_and_round_trips(tmp_path: Path) -> None:
    case = {"id": "test_ops.py::test_a[m-1]", "outcome": "failed", "failure": {"category": "numeric mismatch"},
            "checks": [_check("m=7: numerics", "MUST", False), _check("results are values", "MUST", True),
                       _check("m=1 [x]: declared shape error", "SHOULD", False)]}
    written = expectations.from_summary([case])
    assert [(e.check, e.level) for e in written.entries] == [("m=7: numerics", "MUST"),
                                                            ("m=1 [[]x]: declared shape error", "SHOULD")]
    path = tmp_path / "e.toml"
    path.write_text(written.dumps())
    again = expectations.Expectations.load(path)
    assert again.entries == written.entries
    heads = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line == "[[expect]]"]
    assert [e.source for e in again.entries] == [f"{path.resolve()}:{n}" for n in heads]  # the report links there
    assert all(e.covers(c) for e, c in zip(again.entries, (case["checks"][0], case["checks"][2]), strict=True))
    assert expectations.from_summary([case], again).entries == written.entries
    fixed = {**case, "outcome": "passed", "checks": [_check(c["name"], c["level"], True) for c in case["checks"]]}
    assert expectations.from_summary([fixed], again).entries == ()


def test_whole_case_entries_still_cover_a_whole_case_and_skip_is_whole_case_only() -> None:
    known = expectations.Expectations.parse({"expect": [
        {"pattern": "test_x.py::*", "outcome": "fail", "reason": "broken"}]})
    assert known.match("test_x.py::test_a").whole_case
    with pytest.raises(expectations.ExpectationsError, match="whole cases"):
        expectations.Expectations.parse({"expect": [
            {"pattern": "x", "check": "numerics", "outcome": "skip", "reason": "r"}]})
    with pytest.raises(expectations.ExpectationsError, match="level must be one of"):
        expectations.Expectations.parse({"expect": [{"pattern": "x", "level": "MAY", "outcome": "fail",
                                                     "reason": "r"}]})


SHIPPED_EXPECTATIONS = [ROOT / "conformance" / "adapters" / "mindspeed.expectations.toml",
                        ROOT / "tests" / "support" / "megatron_style.expectations.toml"]


@pytest.mark.parametrize("path", SHIPPED_EXPECTATIONS, ids=lambda p: p.name)
def test_shipped_expectations_name_the_checks_they_know(path: Path) -> None:
    """A known failure never hides another check's failure in the same case: no shipped entry covers a whole case."""
    entries = expectations.Expectations.load(path).entries
    assert entries, path
    whole = [e.pattern for e in entries if e.whole_case and e.outcome == "fail"]
    assert not whole, f"{path.name}: entries naming no check and no level: {whole}"


def _case(outcome: str, failed: tuple[tuple[str, str], ...] = (), passed: tuple[str, ...] = ()) -> dict[str, Any]:
    checks = [{"name": n, "level": level, "passed": False, "outcome": "failed"} for n, level in failed]
    checks += [{"name": n, "level": "MUST", "passed": outcome == "passed",
                "outcome": "not judged" if outcome == "not judged" else "passed"} for n in passed]
    return {"id": "test_explore.py::test_explore", "area": "explore", "outcome": outcome, "checks": checks}


def test_a_new_failing_check_in_a_case_that_already_failed_turns_the_gate_red(tmp_path: Path) -> None:
    baseline = _summary(tmp_path, "base", [_case("failed", (("all_gather_matmul: numerics", "MUST"),))])
    current = _summary(tmp_path, "cur", [_case("failed", (("all_gather_matmul: numerics", "MUST"),
                                                          ("matmul_all_reduce: numerics", "MUST")))])
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current))
    assert result.red and result.new_failures == []
    [(case, new)] = result.new_checks
    assert case["id"] == "test_explore.py::test_explore" and new == [("matmul_all_reduce: numerics", "MUST")]
    same = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(baseline))
    assert not same.red and same.new_checks == []


def test_a_failure_that_became_not_judged_is_no_fix_and_turns_the_gate_red(tmp_path: Path) -> None:
    baseline = _summary(tmp_path, "base", [_case("failed", (("numerics", "MUST"),))])
    current = _summary(tmp_path, "cur", [_case("not judged", passed=("the exploration judged a case",))])
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current))
    assert result.fixes == [] and result.red
    [loss] = result.lost
    assert (loss.case, loss.check, loss.level, loss.before, loss.after) == (
        "test_explore.py::test_explore", "numerics", "MUST", "failed", "not judged")


def _uneven(outcome: str, checks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": "test_ops.py::test_uneven_token_counts[matmul_all_reduce-tp2]", "area": "ops", "outcome": outcome,
            "checks": checks, **extra}


FAILED_NUMERICS = _uneven("failed", [_check("m=1: results are values", "MUST", True),
                                     _check("m=1: numerics", "MUST", False)],
                          failure={"category": "numeric mismatch", "message": "NumericMismatch: m=1 wrong"})
NOT_OFFERED = _uneven("skipped", [{"name": "test_uneven_token_counts", "level": "MUST", "passed": False,
                                   "outcome": "not offered", "message": "not implemented: odd rows"}],
                      skip_reason="not implemented: odd rows")


def test_a_failure_that_became_a_skip_is_a_red_loss_of_judgment_listed_by_case_and_check(tmp_path: Path) -> None:
    """The numerics failed in the baseline; now the op raises NotImplementedError: never "No change"."""
    baseline = _summary(tmp_path, "base", [FAILED_NUMERICS])
    current = _summary(tmp_path, "cur", [NOT_OFFERED])
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current))
    assert result.red and not result.new_failures and not result.fixes
    assert [(x.check, x.before, x.after, x.why) for x in result.lost] == [
        ("m=1: results are values", "passed", "not offered", "not implemented: odd rows"),
        ("m=1: numerics", "failed", "not offered", "not implemented: odd rows")]
    [section] = [s for s in result.sections if s.rows]
    assert section.red and [row.cells[0] for row in section.rows] == ["m=1: results are values", "m=1: numerics"]
    text = gate.markdown(result)
    assert "gate: RED" in text and "Lost judgment" in text and "No change" not in text, text
    assert "| `test_ops.py::test_uneven_token_counts[matmul_all_reduce-tp2]` | m=1: numerics | MUST | failed | " \
           "not offered | not implemented: odd rows |" in text, text
    assert gate.main(["--baseline", str(baseline), "--current", str(current)]) == 1
    same = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(baseline))
    assert not same.sections and "No change in conformance or performance." in gate.markdown(same)


def _with_expectations(path: Path, entries: list[dict[str, str]]) -> Path:
    summary = path / "coc-summary.json"
    doc = json.loads(summary.read_text())
    summary.write_text(json.dumps({**doc, "expectations": entries}))
    return path


@pytest.mark.parametrize("entry", [
    {"pattern": "test_ops.py::test_uneven_token_counts[*]", "outcome": "unjudged", "reason": "odd rows dropped"},
    {"pattern": "test_ops.py::test_uneven_token_counts[*]", "check": "m=1: *", "outcome": "unjudged",
     "reason": "odd rows dropped"}], ids=["whole-case", "its-checks"])
def test_a_loss_the_current_expectations_name_is_listed_as_expected_and_green(tmp_path: Path,
                                                                              entry: dict[str, str]) -> None:
    baseline = _summary(tmp_path, "base", [FAILED_NUMERICS])
    current = _with_expectations(_summary(tmp_path, "cur", [NOT_OFFERED]), [entry])
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current))
    assert not result.red and len(result.lost) == 2 and all(x.expected is not None for x in result.lost)
    [section] = result.sections
    assert not section.red and section.title.startswith("Lost judgment the expectations file expects")
    assert "expected: odd rows dropped" in gate.markdown(result)
    other = _with_expectations(_summary(tmp_path, "other", [NOT_OFFERED]), [{**entry, "pattern": "test_x.py::*"}])
    assert run_diff.diff_runs(runs.load_run(baseline), runs.load_run(other)).red


def test_losses_of_single_checks_missing_cases_and_suite_errors_are_red_but_a_sample_is_not(tmp_path: Path) -> None:
    passed = _uneven("passed", [_check("m=1: numerics", "MUST", True), _check("m=3: numerics", "MUST", True)])
    now = _uneven("passed", [_check("m=1: numerics", "MUST", True),
                             {"name": "m=3", "level": "MUST", "passed": False, "outcome": "not offered",
                              "message": "not implemented: m=3"}])
    gone = {**_numeric("passed"), "id": "test_ops.py::test_gone[x]"}
    broke = {**_numeric("failed"), "id": "test_ops.py::test_broke[x]"}
    suite_bug = {**broke, "outcome": "error", "checks": [], "failure": {"category": "suite error", "message": "bug"}}
    explored = {"id": "test_explore.py::test_explore", "area": "explore", "outcome": "passed",
                "checks": [_check("op: numerics", "MUST", True)], "explore": {}}
    explored_now = {**explored, "checks": [_check("layer: numerics", "MUST", True)]}
    baseline = _summary(tmp_path, "base", [passed, gone, broke, explored])
    current = _summary(tmp_path, "cur", [now, suite_bug, explored_now])
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(current))
    assert result.red and not result.new_failures
    assert sorted((x.case.split("::")[1], x.check, x.after) for x in result.lost) == [
        ("test_broke[x]", "numerics", "error"), ("test_gone[x]", "numerics", "missing"),
        ("test_uneven_token_counts[matmul_all_reduce-tp2]", "m=3: numerics", "missing")]


def test_a_summary_its_run_never_finished_writing_gets_no_verdict(tmp_path: Path) -> None:
    """The suite writes its summary ``complete: false`` when the session starts: a run killed half way in a
    folder that held the last run's summary leaves that one, which the gate refuses (issue 50: GREEN, "No change");
    and a summary beside Allure results of another run is not one run's record."""
    baseline = _summary(tmp_path, "base", [_numeric("passed")])
    current = _summary(tmp_path, "cur", [_numeric("passed")])
    doc = json.loads((current / "coc-summary.json").read_text())
    (current / "coc-summary.json").write_text(json.dumps({**doc, "run_id": "r2", "complete": False}))

    def gate_(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "conformance.gating.gate", *args], cwd=ROOT, capture_output=True,
                              text=True)

    refused = gate_("--baseline", str(baseline), "--current", str(current))
    assert refused.returncode == 2 and "is incomplete" in refused.stderr, refused.stderr
    assert gate_("--current", str(current)).returncode == 2  # the templates' check after the suite
    (current / "coc-summary.json").write_text(json.dumps({**doc, "run_id": "r2", "complete": True}))
    assert gate_("--current", str(current)).returncode == 0
    assert gate_("--baseline", str(baseline), "--current", str(current)).returncode == 0
    (current / "x-result.json").write_text(json.dumps({"labels": [{"name": "coc_run", "value": "r1"}]}))
    other = gate_("--current", str(current))
    assert other.returncode == 2 and "not one run" in other.stderr, other.stderr


def _summary_doc(tmp_path: Path, name: str, cases: list[dict[str, Any]], **fields: Any) -> Path:
    folder = _summary(tmp_path, name, cases)
    doc = json.loads((folder / "coc-summary.json").read_text())
    (folder / "coc-summary.json").write_text(json.dumps({**doc, **fields}))
    return folder


def _should(outcome: str, gated: bool) -> dict[str, Any]:
    case = {"id": "test_layers.py::test_uneven_token_counts[row-nosp-tp2]", "area": "layers",
            "outcome": outcome if outcome == "passed" else "failed" if gated else "not-gated",
            "checks": [{"name": "m=7: one fallback warning per layer", "level": "SHOULD", "outcome": outcome,
                        "passed": outcome == "passed"}]}
    return case


def test_the_gates_smaller_silences_are_listed(tmp_path: Path) -> None:
    """A check outside the gate going from passed to failed is listed (not red); a gate lower than the baseline's
    is red, a higher one listed; stale expectations entries are listed, red only in a run of the whole suite."""
    baseline = _summary_doc(tmp_path, "base", [_should("passed", False)], gate="all")
    quiet = _summary_doc(tmp_path, "quiet", [_should("failed", False)], gate="all")
    lowered = _summary_doc(tmp_path, "lowered", [_should("failed", False)], gate="must")
    result = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(lowered))
    titles = {section.title: section for section in result.sections}
    ungated = titles["New failing checks at levels this run does not gate"]
    assert ungated.rows[0].cells == ("m=7: one fallback warning per layer (SHOULD)",) and not ungated.red
    gates = titles["The gate differs from the baseline's"]
    assert gates.red and gates.rows[0].cells == ("all", "must", "lowered: failures at SHOULD, STRUCTURE no longer "
                                                                "fail the run")
    assert result.red and "No change" not in gate.markdown(result)
    raised = run_diff.diff_runs(runs.load_run(lowered), runs.load_run(quiet))
    assert not raised.red and any(s.title.startswith("The gate differs") for s in raised.sections)
    for full in (False, True):
        stale = _summary_doc(tmp_path, f"stale{full}", [_should("passed", True)], gate="all", full_run=full,
                             stale_expectations=["known.toml:3: pattern 'x' matches no case of the run"])
        diff = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(stale))
        (section,) = diff.sections
        assert section.rows[0].case == "known.toml:3" and diff.red is full


def test_an_expectations_entry_is_stale_when_it_matches_no_case_or_names_no_recorded_check() -> None:
    from conformance.record.expected import Expectation, stale

    cases = {"test_ops.py::test_a[x]": ["numerics", "results are values"], "test_ops.py::test_b[y]": []}
    entries = [Expectation("test_ops.py::test_a*", "fail", "r", check="numerics", source="e.toml:1"),
               Expectation("test_ops.py::test_a*", "fail", "r", check="numerix", source="e.toml:5"),
               Expectation("test_ops.py::test_b*", "fail", "r", check="anything", source="e.toml:9"),  # no checks
               Expectation("test_gone.py::*", "skip", "r", source="e.toml:13")]
    assert stale(entries, cases) == ["e.toml:5: check 'numerix' names no check its 1 case(s) recorded",
                                     "e.toml:13: pattern 'test_gone.py::*' matches no case of the run"]


def test_a_deterministic_result_whose_bits_changed_between_runs_is_red_where_nothing_else_changed(
        tmp_path: Path) -> None:
    """Digests of the same case, inputs and tiling are compared where the two runs are of one implementation code,
    device and torch: other bits are red; another environment compares nothing (its bits may differ)."""
    env = {"implementation": "x:Y", "implementation_code": "c1", "device": "cpu", "name": "EPYC", "backend": "gloo",
           "torch": "2.13.0"}

    def case(digest: str) -> dict[str, Any]:
        return {"id": "test_ops.py::test_deterministic_is_bitwise_reproducible[matmul_all_reduce-float32-tp4]",
                "area": "ops", "outcome": "passed", "checks": [{"name": "numerics", "level": "MUST", "passed": True}],
                "digests": [{"op": "matmul_all_reduce", "tp": 4, "layout": "contiguous", "strides": "contiguous",
                             "transpose_weight": False, "tiling": None, "problem": {"m": 64, "dtype": "float32"},
                             "digest": digest}]}

    baseline = _summary_doc(tmp_path, "base", [case("aa")], determinism_environment=env)
    same = _summary_doc(tmp_path, "same", [case("aa")], determinism_environment=env)
    other_bits = _summary_doc(tmp_path, "bits", [case("bb")], determinism_environment=env)
    other_code = _summary_doc(tmp_path, "code", [case("bb")],
                              determinism_environment={**env, "implementation_code": "c2"})
    assert not run_diff.diff_runs(runs.load_run(baseline), runs.load_run(same)).sections
    changed = run_diff.diff_runs(runs.load_run(baseline), runs.load_run(other_bits))
    (section,) = changed.sections
    assert changed.red and section.title.startswith("Deterministic results whose bits changed")
    assert section.rows[0].cells == ("matmul_all_reduce tp4 float32 its own tiling",)
    assert not run_diff.diff_runs(runs.load_run(baseline), runs.load_run(other_code)).sections
