"""Verdicts: pass, fail, known, skipped and not judged per check; the suite's own errors kept apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.contract.layouts import Split
from conformance.harness.case import CapturedError
from conformance.harness.case_errors import CaseTimeout
from conformance.judge import assembly, checks
from conformance.judge.failures import ReplicaMismatch, WrongError
from conformance.judge.levels import Level
from conformance.judge.verdicts import NOT_JUDGED, NotJudged, Verdicts


def _error(exc: BaseException) -> CapturedError:
    return CapturedError.capture(exc)


def test_some_ranks_raising_not_implemented_while_others_return_is_not_a_skip() -> None:
    missing = _error(NotImplementedError("no deterministic mode"))
    checks.skip_if_not_implemented([None, missing])  # does not skip: the next checks fail it
    with pytest.raises(pytest.skip.Exception, match="no deterministic mode"):
        checks.skip_if_not_implemented([missing, missing])
    checks.skip_if_not_implemented([missing, _error(ValueError("m"))])


def test_a_hang_inside_a_should_check_stays_a_hang() -> None:
    verdicts = Verdicts()
    with pytest.raises(CaseTimeout), verdicts.check("declared error type", Level.SHOULD):
        raise CaseTimeout("did not finish within 10 s")
    assert verdicts.results == []


def test_not_judged_is_recorded_apart_from_passed() -> None:
    verdicts = Verdicts()
    with verdicts.check("overlap structure", Level.STRUCTURE):
        raise NotJudged("every phase declared none")
    verdicts.not_judged("perf gate", Level.MUST, "not enforced here")
    assert [(r.outcome, r.passed, r.failed) for r in verdicts.results] == [(NOT_JUDGED, False, False)] * 2
    assert verdicts.failed() == [] and verdicts.results[0].as_dict()["outcome"] == NOT_JUDGED


def test_replicas_within_the_bound_are_each_judged_and_bitwise_identity_is_a_should() -> None:
    a = torch.tensor([[1.0, 2.0]])
    b = torch.nextafter(a, torch.full_like(a, 2.0))
    held = assembly.copies([a, b, a], Split.FULL)
    assert [who for who, _ in held] == ["the copy on rank(s) [0, 2]", "the copy on rank(s) [1]"]
    assert assembly.copies([a, a], Split.FULL) == [("", a)]
    with pytest.raises(ReplicaMismatch, match="rank 1's copy") as raised:
        assembly.check_identical_copies([a, b], Split.FULL, "y")
    assert raised.value.level is Level.SHOULD


def test_a_clear_refusal_comes_before_any_collective_and_names_what_it_refuses() -> None:
    names = [r"\b7\b", r"\bm\b", r"\btp\b"]
    refusal = _error(ValueError("matmul_reduce_scatter: m=7 rows cannot be scattered over tp=2 ranks"))
    checks.check_clear_refusal([refusal, refusal], [[], []], what="rs m=7", names=names)
    bug = _error(TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'"))
    with pytest.raises(WrongError, match="names none of what it refuses"):
        checks.check_clear_refusal([bug, bug], [[], []], what="ar m=7", names=names)
    with pytest.raises(WrongError, match="after collectives had run"):
        checks.check_clear_refusal([refusal, refusal], [["all_reduce"], []], what="rs m=7", names=names)


PLUGIN = ("-p", "conformance.plugin", "-p", "no:cacheprovider")


def _summary(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    path = pytester.path / "summary.json"
    result = pytester.runpytest(*PLUGIN, "--coc-summary", str(path), *args)
    return result, {c["id"].split("::")[-1]: c for c in json.loads(path.read_text())["cases"]}


CASES = """
    import pytest
    from conformance.harness.case_errors import CaseTimeout
    from conformance.judge.failures import WrongError, suite_requires
    from conformance.judge.levels import Level
    from conformance.judge.verdicts import NotJudged

    def test_hang_in_should(verdicts):
        with verdicts.check("declared error type", Level.SHOULD):
            raise CaseTimeout("did not finish")

    def test_suite_bug(verdicts):
        with verdicts.check("numerics", Level.MUST):
            {}["no such key"]

    def test_self_check(verdicts):
        suite_requires(False, "exact data out of range")

    def test_none_phase(verdicts):
        with verdicts.check("overlap structure", Level.STRUCTURE):
            raise NotJudged("every phase declared none")

    @pytest.mark.coc_level("MUST")
    def test_perf_not_enforced():
        raise NotJudged("gate not enforced here")

    def test_known_and_new(verdicts):
        with verdicts.check("declared error type", Level.SHOULD):
            raise WrongError("untyped", level=Level.SHOULD)
        with verdicts.check("numerics", Level.MUST):
            raise WrongError("wrong rows")

    def test_known_only(verdicts):
        with verdicts.check("declared error type", Level.SHOULD):
            raise WrongError("untyped", level=Level.SHOULD)
        with verdicts.check("numerics", Level.MUST):
            pass

    def test_fixed(verdicts):
        with verdicts.check("declared error type", Level.SHOULD):
            pass
"""

EXPECTED = """
[[expect]]
pattern = "test_cases.py::test_known_*"
check = "declared error type"
outcome = "fail"
reason = "untyped errors"

[[expect]]
pattern = "test_cases.py::test_fixed"
check = "declared error type"
outcome = "fail"
reason = "untyped errors"
"""


def test_outcomes_per_check_in_the_summary_and_the_tally(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cases=CASES)
    pytester.makefile(".toml", known=EXPECTED)
    result, cases = _summary(pytester, "--coc-expectations", "known.toml", "-rA")
    text = result.stdout.str()
    # a hang inside a SHOULD check is a MUST failure of its own class
    hang = cases["test_hang_in_should"]
    assert hang["outcome"] == "failed" and hang["failure"]["category"] == "hang"
    assert [c["level"] for c in hang["checks"]] == ["MUST"]
    # the suite's own bugs are errors naming the suite, never an implementation's failed check
    for name in ("test_suite_bug", "test_self_check"):
        assert cases[name]["outcome"] == "error" and cases[name]["failure"]["category"] == "suite error", cases[name]
        assert not [c for c in cases[name].get("checks", ()) if c["outcome"] == "failed"]
    assert "suite bug in" in text and "ERROR test_cases.py::test_suite_bug" in text
    # not judged is neither passed nor failed: a case that judged nothing is not judged, never passed
    for name in ("test_none_phase", "test_perf_not_enforced"):
        assert cases[name]["outcome"] == NOT_JUDGED
        assert [c["outcome"] for c in cases[name]["checks"]] == [NOT_JUDGED]
    assert "1 not judged" in text
    # a known failure of one check never hides another's
    assert cases["test_known_and_new"]["outcome"] == "failed"
    assert cases["test_known_only"]["outcome"] == "known"
    fixed = cases["test_fixed"]
    assert fixed["outcome"] == "failed" and fixed["failure"]["category"] == "unexpected pass"


def test_the_gate_reads_an_unexpected_pass_from_a_real_summary(pytester: pytest.Pytester) -> None:
    from conformance.judge import run_diff

    pytester.makepyfile(test_cases=CASES)
    pytester.makefile(".toml", known=EXPECTED)
    _summary(pytester, "--coc-expectations", "known.toml", "-k", "fixed")
    result = run_diff.diff_runs(run_diff.Run("b", "?", {}), run_diff.load_run(pytester.path / "summary.json"))
    assert [c["id"] for c in result.unexpected_passes] == ["test_cases.py::test_fixed"]


def test_every_smoke_pattern_still_matches_a_collected_case(tmp_path: Path) -> None:
    """A renamed test would silently leave the per-change tier."""
    import subprocess
    import sys

    from conformance.caseids import case_id, matches
    from conformance.tiers import SMOKE
    from tests.support import ROOT

    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
                           "--collect-only", "-q", "--pyargs", "conformance.suite", "--rootdir", str(ROOT),
                           "-c", str(ROOT / "pyproject.toml")], cwd=tmp_path, capture_output=True, text=True)
    cases = [case_id(line) for line in done.stdout.splitlines() if "::" in line]
    assert len(cases) > 100, done.stdout[-2000:] + done.stderr[-2000:]
    unmatched = [pattern for pattern in SMOKE if not any(matches(case, pattern) for case in cases)]
    assert not unmatched, f"smoke patterns matching no collected case: {unmatched}"


class CoCBackendUnavailable(RuntimeError):
    """Named as the reference names its class, declared nowhere."""


class _NoFusedBackend:
    name = "no-fused-backend"

    def configure(self, argv: Any, env: Any, **kwargs: Any) -> Any:
        raise CoCBackendUnavailable("no fused backend on this machine")


def test_an_undeclared_backend_unavailable_error_is_recognised_by_its_class_name() -> None:
    from conformance.protocol import Declarations
    from conformance.suite.test_layers import _fused_or_skip

    declared = Declarations(version=2, error_types={}, overlap={}, fused_overlap={}, fused_layers=True,
                            in_place_ops=frozenset())
    with pytest.raises(pytest.skip.Exception, match="unavailable here"):
        _fused_or_skip(_NoFusedBackend(), declared, 8)
