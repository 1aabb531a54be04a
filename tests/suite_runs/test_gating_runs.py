"""The gate and the expectations workflow over real runs of the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.gating import expectations, gate, matrix
from conformance.record import run_diff
from conformance.record.report_properties import GATE_NOT_RUN, GATE_REPORTED
from conformance.record.runs import load_run
from tests.support import ROOT
from tests.support.suite_run import SuiteRun

OP_CASE = "op_matches_golden and matmul_all_reduce and float32 and tp2 and not wT"


def test_gate_over_real_runs(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """The reference against itself is green; a broken change of it is red, naming the case."""
    runs = {}
    for name, impl in (("base", "coc_impl.reference:ReferenceCoC"), ("same", "coc_impl.reference:ReferenceCoC"),
                       ("broken", "tests.support.faulty_impls:ReturnsWrongShape")):
        (tmp_path / name).mkdir()
        run_suite("test_ops", impl, "-k", OP_CASE, "--coc-summary", str(tmp_path / name / "coc-summary.json"))
        runs[name] = load_run(tmp_path / name)
    assert not run_diff.diff_runs(runs["base"], runs["same"]).red
    result = run_diff.diff_runs(runs["base"], runs["broken"])
    assert result.red and len(result.new_failures) == 1
    assert "expected a tensor [64, 64]" in gate.markdown(result)


def test_expectations_round_trip(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """Write expectations from a failing run: green with them; red on a new fault; red on an unexpected pass."""
    select = ("-k", "op_matches_golden and tp2 and not wT and float32 and (all_reduce or all_gather) and not v2")
    wrong_shape = "tests.support.faulty_impls:ReturnsWrongShape"

    def outcomes(name: str, impl: str, *extra: str) -> tuple[SuiteRun, dict[str, dict[str, Any]]]:
        summary = tmp_path / f"{name}.json"
        run = run_suite("test_ops", impl, *select, "--coc-summary", str(summary), *extra)
        return run, {c["id"]: c for c in json.loads(summary.read_text())["cases"]}

    _, first = outcomes("first", wrong_shape)
    failed = {cid for cid, c in first.items() if c["outcome"] == "failed"}
    assert failed and any("matmul_all_reduce" in cid for cid in failed), first
    known = tmp_path / "known.toml"
    done = subprocess.run([sys.executable, "-m", "conformance.gating.expectations", "--summary",
                           str(tmp_path / "first.json"), "--out", str(known)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    entries = expectations.Expectations.load(known).entries
    assert {e.pattern for e in entries} == failed and all(e.check and e.level for e in entries)
    again, cases = outcomes("again", wrong_shape, "--coc-expectations", str(known))
    assert again.ret == 0 and {cid for cid, c in cases.items() if c["outcome"] == "known"} == failed, cases
    fixed, cases = outcomes("fixed", "coc_impl.reference:ReferenceCoC", "--coc-expectations", str(known))
    unexpected = {cid for cid, c in cases.items() if (c.get("failure") or {}).get("category") == "unexpected pass"}
    assert fixed.ret == 1 and unexpected == failed, cases
    worse, cases = outcomes("worse", "tests.support.faulty_impls:ReturnsWrongShapeTwice", "--coc-expectations",
                            str(known))
    new = {cid for cid, c in cases.items() if c["outcome"] == "failed"}
    assert worse.ret == 1 and new and all("all_gather_matmul" in cid for cid in new), cases


def test_an_unenforced_perf_gate_is_not_run_unless_its_figures_are_asked_for(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """``cpu-gloo`` enforces nothing: by default its case skips, not judged, holding no devices; with
    ``--coc-perf-figures`` it measures and reports its figures, still not judged."""
    cases = {}
    for name, extra in (("default", ()), ("figures", ("--coc-perf-figures",))):
        summary = tmp_path / f"{name}.json"
        run_suite("test_perf", "coc_impl.reference:ReferenceCoC", "-k", "balanced and rs", "--coc-summary",
                  str(summary), *extra)
        [cases[name]] = json.loads(summary.read_text())["cases"]
    default, figures = cases["default"], cases["figures"]
    assert default["outcome"] == "skipped" and default["skip_reason"].startswith("not judged: "), default
    assert default["perf_gate"] == GATE_NOT_RUN and "timings" not in default, default
    assert figures["outcome"] == "not judged" and figures["perf_gate"] == GATE_REPORTED, figures
    assert figures["perf"] and figures["timings"]["exclusive"], figures


UNEVEN = ("-k", "uneven_token_counts and matmul_all_reduce and tp2")


def test_a_failure_that_became_not_offered_turns_the_gate_red_unless_expected(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """Baseline: odd token counts give wrong rows (numerics fails); current: they raise NotImplementedError (not
    offered).  The gate lists the lost checks and is red -- never "No change" -- until the current run's
    expectations file says the case may go unjudged; the matrix counts the case as not offered."""
    runs = {}
    for name, impl, extra in (
            ("base", "tests.support.faulty_impls:OpUnevenGarbageRows", ()),
            ("now", "tests.support.faulty_impls:OddRowsNotImplemented", ()),
            ("expected", "tests.support.faulty_impls:OddRowsNotImplemented",
             ("--coc-expectations", str(tmp_path / "known.toml")))):
        (tmp_path / "known.toml").write_text('[[expect]]\npattern = "test_ops.py::test_uneven_token_counts[*]"\n'
                                             'outcome = "unjudged"\nreason = "odd token counts not implemented"\n')
        (tmp_path / name).mkdir()
        run_suite("test_ops", impl, *UNEVEN, "--coc-summary", str(tmp_path / name / "coc-summary.json"), *extra)
        runs[name] = load_run(tmp_path / name)
    [case] = runs["now"].cases.values()
    assert case["outcome"] == "skipped" and {c["outcome"] for c in case["checks"]} == {"not offered"}, case
    result = run_diff.diff_runs(runs["base"], runs["now"])
    text = gate.markdown(result)
    assert result.red and "gate: RED" in text and "No change" not in text, text
    lost = {(x.check, x.before, x.after) for x in result.lost}
    assert ("m=1: numerics", "failed", "not offered") in lost and all(x.expected is None for x in result.lost), lost
    expected = run_diff.diff_runs(runs["base"], runs["expected"])
    assert not expected.red and expected.lost and all(x.expected is not None for x in expected.lost)
    assert "odd token counts not implemented" in gate.markdown(expected)
    table = matrix.markdown({"now": list(runs["now"].cases.values())})
    assert "| now | judged nothing | 0 / 0 / 0 / 0 / 5 |" in table, table  # one per token count
