"""Allure results of the suite: labels, parameters, attachments, categories, environment, history.

A small synthetic suite (a passing and a failing numerics case, a hang, a
check failure raised on a rank, a missing error, a perf timeline, a case of
named checks with a failed MUST one, a case whose one check was not judged) runs twice
with ``--alluredir``: once in one process on device ``cpu``, once under
``-n 2`` on device ``npu:0``.  Both runs must describe every case the same
way; the device must not change a history id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.reporting import meta as report_meta
from tests.support import ROOT

SYNTHETIC_SUITE = '''
import os

import numpy as np
import pytest

from coc_shared.timeline import simulate
from conformance.harness import case_errors as errors
from conformance.judge import numerics
from conformance.record import failures
from conformance.reporting.allure import attachments, labels
from conformance.contract.rank_errors import CapturedError
from conformance.harness.case import RankOutcome
from conformance.record.levels import Level
from conformance.record.verdicts import NotJudged

DEVICE = os.environ["SYNTH_DEVICE"]


def comparison(broken):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((24, 16)), rng.standard_normal((16, 8))
    truth = a @ b
    serial = truth.astype(np.float32).astype(np.float64)
    out = serial.copy()
    if broken:
        out[20:] = 0.0  # remainder rows left uninitialised
    return numerics.compare("out", out, truth, serial, magnitude=numerics.magnitude(a, b),
                            reduction_len=16, roundings=1, dtype="float32")


@pytest.mark.parametrize("device", [DEVICE])
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("op", ["all_gather_matmul"])
def test_numerics(op, tp, device):
    result = comparison(broken=tp == 4)
    labels.describe_case(feature=op, story="sp", title=f"{op} sp tp{tp}", severity="critical",
                            chunks=4, dtype="float32", shape=(24, 16, 8))
    attachments.attach_comparison(result)
    if not result.stats.ok:
        raise failures.NumericMismatch(result.stats.summary())


@pytest.mark.parametrize("tp", [4])
def test_hang(tp):
    raise errors.CaseTimeout("case did not finish on every rank within 1.0 s",
                             stacks={0: "File case.py, line 3 in fn\\n  all_reduce()", 1: "File case.py"},
                             outcomes=[RankOutcome(0, log="rank 0 entered all_reduce")])


@pytest.mark.parametrize("tp", [2])
def test_rank_raised(tp):
    error = CapturedError("conformance.record.failures.DeterminismViolation", "runs differ",
                        "Traceback (most recent call last):\\nDeterminismViolation: runs differ")
    raise errors.RankRaised(
        "rank(s) [1] raised; rank 1: conformance.record.failures.DeterminismViolation: runs differ",
        outcomes=[RankOutcome(0, value=1, log="rank 0 done"), RankOutcome(1, error=error, log="rank 1 log")])


def test_missing_error():
    with pytest.raises(ValueError):
        pass


def test_perf_timeline():
    predicted = simulate([64] * 4, lambda m: 2.0 * m, lambda m: 1.5 * m + 10)
    measured = {"mm": [140.0] * 4, "comm": [(150, 260), (290, 400), (430, 540), (570, 690)]}
    labels.describe_case(feature="row all-reduce", story="perf", tp=8)
    attachments.attach_timeline(predicted, measured, "row all-reduce")


@pytest.mark.parametrize("tp", [2])
def test_checked(verdicts, tp):
    with verdicts.check("numerics", Level.MUST):
        raise failures.NumericMismatch("out: 3 elements over the bound on rank 1")
    with verdicts.check("warning", Level.SHOULD):
        pass


def test_nothing_to_judge(verdicts):
    with verdicts.check("perf gate", Level.MUST):
        raise NotJudged("no profile matches this machine")
'''

#: test function -> (status, category, attachment names)
EXPECTED = {
    "test_numerics[2]": ("passed", None, {"out: error statistics"}),
    "test_numerics[4]": ("failed", "Numeric mismatch",
                         {"out: error statistics", "out: |diff| / bound", "out: |diff| heat-map"}),
    "test_hang[4]": ("failed", report_meta.HANG, {"rank 0 stack", "rank 1 stack", "rank 0 log"}),
    "test_rank_raised[2]": (
        "failed", "Determinism violation", {"rank 1 traceback", "rank 0 log", "rank 1 log"}),
    "test_missing_error": ("failed", "Missing or wrong error", set()),
    "test_perf_timeline[8]": ("passed", None, {"row all-reduce: timeline"}),
    "test_checked[2]": ("failed", "Numeric mismatch", set()),
    "test_nothing_to_judge": ("skipped", None, set()),
}


@dataclass
class Run:
    results: Path
    device: str
    cases: dict[str, dict[str, Any]]  # _key(result) -> result JSON

    @classmethod
    def load(cls, results: Path, device: str) -> Run:
        cases = [json.loads(path.read_text()) for path in results.glob("*-result.json")]
        by_key = {_key(case): case for case in cases}
        assert len(by_key) == len(cases), "a case was reported twice"
        return cls(results, device, by_key)


def _key(result: dict[str, Any]) -> str:
    """The test function and its TP parameter (the device stays out: it differs between runs)."""
    tp = [p["value"] for p in result.get("parameters", []) if p["name"] == "tp"]
    function = result["fullName"].split("#")[1]
    return f"{function}[{tp[0]}]" if tp else function


def _labels(result: dict[str, Any]) -> dict[str, list[str]]:
    labels: dict[str, list[str]] = {}
    for label in result["labels"]:
        labels.setdefault(label["name"], []).append(label["value"])
    return labels


def _run_synthetic(workdir: Path, device: str, *extra: str) -> Run:
    workdir.mkdir(parents=True)
    (workdir / "pytest.ini").write_text("[pytest]\n")
    (workdir / "test_synth.py").write_text(textwrap.dedent(SYNTHETIC_SUITE))
    results = workdir / "allure-results"
    env = {**os.environ, "SYNTH_DEVICE": device,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conformance.plugin", "-q",
         f"--alluredir={results}", *extra],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # 5 failing cases
    return Run.load(results, device)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[tuple[Run, Run]]:
    """Both runs, made once per session even when xdist workers share this module."""
    from filelock import FileLock

    def make(root: Path) -> tuple[Run, Run]:
        if not (root / "done").exists():
            _run_synthetic(root / "single", "cpu")
            _run_synthetic(root / "xdist", "npu:0", "-n", "2", "--coc-figures=all", "--coc-launcher=process")
            (root / "done").touch()
        return Run.load(root / "single" / "allure-results", "cpu"), \
            Run.load(root / "xdist" / "allure-results", "npu:0")

    if worker_id == "master":
        yield make(tmp_path_factory.mktemp("allure-runs"))
        return
    shared = tmp_path_factory.getbasetemp().parent / "allure-runs"  # this session's, shared by workers
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        made = make(shared)
    yield made


def test_every_case_reported_once_in_both_runs(runs: tuple[Run, Run]) -> None:
    for run in runs:
        assert set(run.cases) == set(EXPECTED), run.results
        assert not list(run.results.glob("*.tmp"))
        for name, (status, _, _) in EXPECTED.items():
            assert run.cases[name]["status"] == status, name


def test_labels_titles_and_parameters(runs: tuple[Run, Run]) -> None:
    single, _ = runs
    described = single.cases["test_numerics[4]"]
    labels = _labels(described)
    assert (labels["epic"], labels["feature"], labels["story"], labels["severity"]) == (
        ["CoC"], ["all_gather_matmul"], ["sp"], ["critical"])
    assert described["name"] == "all_gather_matmul sp tp4"
    params = {p["name"]: p for p in described["parameters"]}
    assert {name: p["value"] for name, p in params.items()} == {
        "op": "all_gather_matmul", "tp": "4", "device": "cpu", "chunks": "4", "dtype": "float32",
        "shape": "24x16x8", "implementation": "coc_impl.reference:ReferenceCoC"}
    assert params["device"].get("excluded") is True and params["implementation"].get("excluded") is True
    assert not any(p.get("excluded") for name, p in params.items() if name not in ("device", "implementation"))

    derived = single.cases["test_hang[4]"]  # nothing described: defaults from names and parameters
    labels = _labels(derived)
    assert (labels["epic"], labels["feature"], labels["story"], labels["severity"]) == (
        ["CoC"], ["synth"], ["hang"], ["normal"])
    assert derived["name"] == "Hang [tp=4]"


def test_checks_as_steps_severity_and_reproduce_command(runs: tuple[Run, Run]) -> None:
    """One step per check with its level and outcome; severity and tags from the failed level; the command."""
    for run, options in zip(runs, ("", " --coc-launcher process"), strict=True):  # options given: repeated
        case = run.cases["test_checked[2]"]
        steps = [(step["name"], step["status"]) for step in case["steps"]]
        assert steps == [("[MUST] numerics: failed", "failed"), ("[SHOULD] warning: passed", "passed")], steps
        assert "3 elements over the bound" in case["steps"][0]["statusDetails"]["message"]
        labels = _labels(case)
        assert labels["severity"] == ["critical"] and labels["requirement"] == ["MUST"]
        assert {"MUST failed", "SHOULD passed"} <= set(labels["tag"]), labels["tag"]
        message = case["statusDetails"]["message"]
        assert message.endswith("reproduce: pytest 'test_synth.py::test_checked[2]' --coc-impl "
                                "coc_impl.reference:ReferenceCoC" + options), message
        trace = case["statusDetails"]["trace"]
        assert "test_checked" in trace and not any(internal in trace for internal in ("_pytest", "pluggy",
                                                                                       "level_gate"))


def test_not_judged_is_never_passed(runs: tuple[Run, Run]) -> None:
    for run in runs:
        case = run.cases["test_nothing_to_judge"]
        assert case["status"] == "skipped"
        assert case["statusDetails"]["message"] == "not judged: perf gate: no profile matches this machine"
        assert [(s["name"], s["status"]) for s in case["steps"]] == [("[MUST] perf gate: not judged", "skipped")]
        assert _labels(case)["requirement"] == ["not judged"]


def test_attachments_present(runs: tuple[Run, Run]) -> None:
    for run in runs:
        for name, (_, _, attachments) in EXPECTED.items():
            found = {a["name"]: a for a in run.cases[name].get("attachments", [])}
            assert attachments <= set(found), (name, set(found))
            for attachment in found.values():
                assert (run.results / attachment["source"]).stat().st_size > 0
        pngs = [a for case in run.cases.values() for a in case.get("attachments", [])
                if a["type"] == "image/png"]
        assert pngs and all((run.results / a["source"]).read_bytes()[:4] == b"\x89PNG" for a in pngs)
    stack = next(a for a in runs[0].cases["test_hang[4]"]["attachments"] if a["name"] == "rank 0 stack")
    assert "all_reduce()" in (runs[0].results / stack["source"]).read_text()


def test_figures_for_failures_unless_all_are_asked_for(runs: tuple[Run, Run]) -> None:
    """A passing comparison gets its table (with the distribution); a figure only with --coc-figures=all."""
    default, every = runs
    default_names, every_names = ({a["name"] for a in run.cases["test_numerics[2]"]["attachments"]}
                                  for run in runs)
    assert "out: |diff| / bound" not in default_names
    assert "out: |diff| / bound" in every_names
    table = next(a for a in default.cases["test_numerics[2]"]["attachments"] if a["name"] == "out: error statistics")
    assert table["type"] == "text/markdown"
    rows = dict(tuple(cell.strip().replace("\\|", "|") for cell in line.strip("|").split(" | "))
                for line in (default.results / table["source"]).read_text().splitlines()[2:])
    decades = {k: int(v) for k, v in rows.items() if k.startswith("|diff|")}
    assert sum(decades.values()) == 24 * 8 and not decades["|diff| / bound > 1 (violations)"], rows


def test_categories(runs: tuple[Run, Run]) -> None:
    for run in runs:
        rules = json.loads((run.results / "categories.json").read_text())
        assert [r["name"] for r in rules] == ["Numeric mismatch", "Determinism violation",
                                              "Missing or wrong error", "Result contract", "Overlap structure",
                                              "Perf regression", report_meta.HANG]
        for name, (_, category, _) in EXPECTED.items():
            case = run.cases[name]
            message = case.get("statusDetails", {}).get("message", "")
            assert report_meta.matching_category(rules, case["status"], message) == category, name


def test_environment(runs: tuple[Run, Run]) -> None:
    for run, workers in zip(runs, ("0", "2"), strict=True):
        lines = (run.results / "environment.properties").read_text().splitlines()
        env = dict(line.split("=", 1) for line in lines)
        assert {"torch", "device", "backend", "world_sizes", "implementation", "git_sha"} <= set(env)
        assert env["world_sizes"] == "2, 4"  # under xdist: merged from both workers
        assert env["implementation"] == "coc_impl.reference:ReferenceCoC"
        assert env["xdist_workers"] == workers


def test_history_ids_ignore_device(runs: tuple[Run, Run]) -> None:
    single, xdist = runs
    for name in EXPECTED:
        a, b = single.cases[name], xdist.cases[name]
        assert a["historyId"] == b["historyId"], name
        shown = [[(p["name"], p["value"]) for p in case.get("parameters", []) if not p.get("excluded")]
                 for case in (a, b)]
        assert shown[0] == shown[1], name  # what Allure 3 keys history on
