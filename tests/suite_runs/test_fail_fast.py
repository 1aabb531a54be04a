"""A broken implementation fails fast and clearly (docs/DESIGN.md#time-budget, #storm-breaker).

The bad-input table: every row is tried here (or, for results of the wrong
kind, in the proof table of tests/suite_runs/test_suite_bites.py) and must end in a clear
error on every rank -- never a hang, never a pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.harness.case import Budget, RankTask
from conformance.harness.case_errors import CaseTimeout, RankCrashed
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.options import DEFAULT_IMPL
from tests.support import ROOT, rank_cases
from tests.support.suite_run import SuiteRun


def test_a_hang_in_a_quick_case_is_declared_at_its_budget_not_the_ceiling() -> None:
    """The verdict names the budget: the clock gives that verdict only before the ceiling (120 s)."""
    launcher = ProcessLauncher(DeviceKind("cpu", "gloo", None, 8), max_live_ranks=2)
    try:
        launcher.run(RankTask(rank_cases.rank_sum, 2), (), DEFAULT_IMPL)  # the pool's start is not the hang
        start = time.monotonic()
        with pytest.raises(CaseTimeout, match=r"no rank used CPU time for the last [\d.]+ s of the case's budget "
                           r"\(.*; ceiling 120 s\)") as info:
            launcher.run(RankTask(rank_cases.budget_then_hang, 2, timeout=120, budget=Budget(20, 1.5)), (),
                         DEFAULT_IMPL)
        print(f"a hang with a budget of 1.7 s declared after {time.monotonic() - start:.1f} s (ceiling 120 s)")
        assert all("budget_then_hang" in info.value.stacks[r] for r in (0, 1))
    finally:
        launcher.close()


def test_a_rank_that_dies_while_the_pool_starts_is_a_crash_with_its_output() -> None:
    launcher = ProcessLauncher(DeviceKind("cpu", "no-such-backend", None, 8), max_live_ranks=2)
    try:
        with pytest.raises(RankCrashed, match=r"failed to start: rank\(s\) \[.*\] exited") as info:
            launcher.run(RankTask(rank_cases.whoami, 2), (), DEFAULT_IMPL)
        assert any("no-such-backend" in stack for stack in info.value.stacks.values()), info.value.stacks
    finally:
        launcher.close()


@pytest.mark.parametrize("fault, what", [("DeadlocksEverywhere", "hung"), ("CrashesEverywhere", "crashed")])
def test_a_storm_of_hangs_fails_the_rest_of_the_capability_at_once(run_suite: Callable[..., SuiteRun],
                                                                   fault: str, what: str) -> None:
    """Two hangs (or crashes) in a row of matmul_all_reduce; its other cases fail without running.

    That they did not run is what their message says (the breaker refuses
    before any rank run); the run's wall time is printed, not bounded.
    """
    start = time.monotonic()
    run = run_suite("test_ops", f"tests.support.faulty_impls:{fault}", "-k", "op_matches_golden and matmul_all_reduce",
                    "--coc-storm", "2", "--coc-budget-floor", "2")
    elapsed = time.monotonic() - start
    broken = run.output.count("not run: 2 case(s) of op:matmul_all_reduce in a row hung or crashed")
    selected = sum(n for outcome, n in run.outcomes.items() if outcome not in ("deselected", "warnings"))
    assert selected >= 10 and len(run.failed) == selected and not run.passed, run.output[-3000:]
    assert broken >= selected - 2, f"{broken} storm-broken cases of {selected}\n{run.output[-3000:]}"
    assert "--- rank 1 stack ---" in run.output or "exit code 9" in run.output
    print(f"{fault}: {selected} cases in {elapsed:.1f} s")


STORM_CASES = """
import pytest

from conformance.harness.case_errors import CaseTimeout
from tests.support import rank_cases

pytestmark = pytest.mark.coc_capability("op:x")


@pytest.mark.parametrize("i", [1, 2])
def test_hangs(i, coc_ranks):
    raise CaseTimeout(f"hang {i}")


@pytest.mark.coc_requires("an_op_nobody_implements")
def test_needs_an_op_the_implementation_lacks(coc_ranks):
    coc_ranks.run(rank_cases.whoami, 2)


def test_declares_it_lacks_a_mode(coc_ranks):
    pytest.skip("declares no fused-kernel layers")


def test_needs_ranks(coc_ranks):
    coc_ranks.run(rank_cases.whoami, 2)
"""


def test_a_storm_never_fails_a_case_whose_capability_is_missing(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 run_pytest: Callable[..., pytest.RunResult]) -> None:
    """After two hangs of op:x, its cases that skip for a capability skip; the one that needs ranks fails unrun."""
    pytester.makepyfile(test_storm=STORM_CASES)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = run_pytest("-p", "no:cacheprovider", "-rs", "-v", "--coc-impl", DEFAULT_IMPL, "--coc-storm", "2")
    output = result.stdout.str()
    outcomes = dict(re.findall(r"::(test_\w+(?:\[\d\])?) (PASSED|FAILED|SKIPPED)", output))
    assert outcomes == {"test_hangs[1]": "FAILED", "test_hangs[2]": "FAILED",
                        "test_needs_an_op_the_implementation_lacks": "SKIPPED",
                        "test_declares_it_lacks_a_mode": "SKIPPED", "test_needs_ranks": "FAILED"}, output
    assert "does not implement an_op_nobody_implements" in output, output
    assert "StormBroken: not run: 2 case(s) of op:x in a row hung or crashed" in output, output


def test_an_implementation_that_cannot_be_loaded_stops_the_session_at_once(
        pytester: pytest.Pytester, run_pytest: Callable[..., pytest.RunResult]) -> None:
    pytester.makepyfile(broken_impl="raise RuntimeError('the vendor library is missing')\n",
                        not_impl="class Thing:\n    pass\nTHING = Thing()\n")
    for spec, message in (("broken_impl:Impl", "importing 'broken_impl' raised RuntimeError: the vendor library"),
                          ("not_impl:THING", "lacks 'name' and 'configure'"),
                          ("nowhere_impl:Impl", "no module named 'nowhere_impl'")):
        result = run_pytest("--coc-impl", spec)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        assert message in result.stderr.str(), result.stderr.str()


def test_a_corrupted_golden_file_names_the_file_and_the_fix(run_suite: Callable[..., SuiteRun], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "golden"
    shutil.copytree(ROOT / "golden", store, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    victim = next((store / "data").glob("op-matmul_all_reduce-m64k96n64-float32-*.npz"))
    victim.write_bytes(victim.read_bytes()[:-7] + b"garbage")
    monkeypatch.setenv("COC_GOLDEN_DIR", str(store))
    run = run_suite("test_ops", DEFAULT_IMPL, "-k", "op_matches_golden and matmul_all_reduce and m64k96n64 and tp2 "
                    "and not wT")
    assert run.failed and not run.passed
    assert victim.name in run.output and "python -m golden.generate" in run.output
    victim.unlink()
    run = run_suite("test_ops", DEFAULT_IMPL, "-k", "op_matches_golden and matmul_all_reduce and m64k96n64 and tp2 "
                    "and not wT")
    assert run.failed and "is missing" in run.output and "python -m golden.generate" in run.output


def test_a_worker_that_dies_loses_only_its_case(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """Results of finished cases survive; the summary counts collected cases against results; the lost case is
    reported under its kind."""
    summary = tmp_path / "coc-summary.json"
    results = tmp_path / "allure-results"
    run_suite("test_config", "tests.support.faulty_impls:KillsItsTestProcess", "-n", "2", "-k", "effective_config",
              "--coc-summary", str(summary), f"--alluredir={results}")
    doc = json.loads(summary.read_text())
    victims = [c for c in doc["cases"] if "cli-fused" in c["id"]]
    assert doc["collected"] == 12 and doc["reported"] == 12, doc
    assert victims and victims[0]["outcome"] in ("failed", "error"), victims
    assert doc["crashed"], doc
    lines = (summary.with_name(summary.name + "l")).read_text().splitlines()
    assert len(lines) == 12
    assert doc["allure_results"] == 12  # the controller wrote the crashed case's
    lost = [json.loads(p.read_text()) for p in results.glob("*-result.json")]
    lost = [r for r in lost if r["status"] == "broken"]
    assert [r["name"] for r in lost] == [victims[0]["nodeid"].split("::", 1)[1]], lost
    assert lost[0]["statusDetails"]["message"].startswith("conformance.harness.case_errors.WorkerLost: ")
    # its kind, as a worker that lived collected it (the controller collects nothing): the report's feature
    assert [label["value"] for label in lost[0]["labels"] if label["name"] == "feature"] == ["config"], lost


def test_cases_left_unrun_by_maxfail_are_missing_not_broken(run_suite: Callable[..., SuiteRun],
                                                             tmp_path: Path) -> None:
    """``-x`` loses no worker: unrun cases are listed as missing, and no broken "lost" results appear."""
    summary = tmp_path / "coc-summary.json"
    results = tmp_path / "allure-results"
    run_suite("test_config", "tests.support.faulty_impls:EnvBeatsCommandLine", "-n", "1", "-x",
              "-k", "effective_config", "--coc-summary", str(summary), f"--alluredir={results}")
    doc = json.loads(summary.read_text())
    assert doc["collected"] == 12 and doc["missing"] and not doc["crashed"], doc
    written = [json.loads(p.read_text()) for p in results.glob("*-result.json")]
    assert len(written) == doc["reported"] and all(r["status"] != "broken" for r in written), written


def test_a_rank_server_it_may_not_share_is_not_used_saying_why(run_suite: Callable[..., SuiteRun],
                                                                tmp_path: Path) -> None:
    """``--coc-rank-server`` naming no server (or one running other code, ``test_launchers``): the session warns
    and runs its cases on ranks of its own."""
    gone = tmp_path / "gone.sock"
    run = run_suite("test_ops", DEFAULT_IMPL, "-k", "op_matches_golden and matmul_all_reduce and tp2 and float32 "
                    "and not wT", "--coc-rank-server", str(gone))
    assert run.ret == 0 and run.passed >= 1 and not run.failed, run.output[-3000:]
    assert re.search(rf"--coc-rank-server {re.escape(str(gone))}: not used, no rank server answers", run.output), \
        run.output[-3000:]


def test_os_exit_in_the_test_process_is_the_implementations_error_never_the_end_of_the_run(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """``os._exit(0)`` in ``configure``, which config cases call in the pytest process: the case fails, the run goes
    on to a complete summary and a failing exit status (issue 50: one process exited 0 with no summary)."""
    summary = tmp_path / "coc-summary.json"
    run = run_suite("test_config", "tests.support.faulty_impls:ExitsItsTestProcess", "-n", "0", "-k",
                    "effective_config", "--coc-summary", str(summary))
    doc = json.loads(summary.read_text())
    victims = [c for c in doc["cases"] if "cli-fused" in c["id"]]
    assert run.ret == 1 and doc["complete"] and doc["reported"] == doc["collected"] == 12, run.output[-3000:]
    assert victims[0]["outcome"] == "failed" and "os._exit(0) called in the test process" in json.dumps(victims[0])


def test_a_run_killed_half_way_leaves_an_incomplete_summary_never_the_last_runs(tmp_path: Path) -> None:
    """The summary is written when the session starts (``complete: false``) and again when it ends: a session
    killed half way, in a folder that held the last run's summary, leaves its own incomplete one, which the gate
    refuses (issue 50: GREEN, "No change", over the last run's summary)."""
    import subprocess
    import sys

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "test_dies.py").write_text("import os\n\ndef test_fine():\n    pass\n\n"
                                         "def test_killed():\n    os.kill(os.getpid(), 9)\n")
    summary = folder / "coc-summary.json"
    summary.write_text(json.dumps({"run_id": "the-last-run", "complete": True, "cases": []}))

    def session(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:xdist", "-q",
                               "--coc-summary", str(summary), *args], cwd=folder, capture_output=True, text=True,
                              timeout=300)

    session()
    doc = json.loads(summary.read_text())
    assert doc["run_id"] != "the-last-run" and doc["complete"] is False, doc
    gated = subprocess.run([sys.executable, "-m", "conformance.gating.gate", "--current", str(folder)], cwd=ROOT,
                           capture_output=True, text=True)
    assert gated.returncode == 2 and "is incomplete" in gated.stderr, gated.stderr
    session("-k", "fine")
    assert json.loads(summary.read_text())["complete"] is True


def test_reruns_of_failed_cases_are_a_usage_error(run_pytest: Callable[..., pytest.RunResult]) -> None:
    """pytest-rerunfailures would run a failed case again and report the last attempt: a failure, then a refusal,
    came out skipped with exit status 0 (issue 50).  The suite refuses the option instead."""
    pytest.importorskip("pytest_rerunfailures")
    result = run_pytest("-p", "no:cacheprovider", "-q", "--pyargs", "conformance.suite.test_config", "--rootdir",
                        str(ROOT), "-c", str(ROOT / "pyproject.toml"), "-k", "effective_config", "--reruns", "1")
    said = result.stdout.str() + result.stderr.str()
    assert result.ret == 4 and "reruns (1; pytest-rerunfailures) are refused" in said, said[-3000:]
