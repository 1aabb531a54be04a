"""Verdicts: pass, fail, known, skipped and not judged per check; the suite's own errors kept apart."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from conformance.contract.layouts import Split
from conformance.contract.rank_errors import CapturedError
from conformance.harness.case_errors import CaseTimeout
from conformance.judge import assembly, checks
from conformance.record.failures import CheckFailure, ReplicaMismatch, WrongError
from conformance.record.levels import Level
from conformance.record.verdicts import FAILED, NOT_JUDGED, NotJudged, NotOffered, Verdicts


def _error(exc: BaseException) -> CapturedError:
    return CapturedError.capture(exc)


def test_some_ranks_raising_not_implemented_while_others_return_is_not_a_skip() -> None:
    missing = _error(NotImplementedError("no deterministic mode"))
    checks.require_offered([None, missing])  # offered on some ranks: the next checks fail it
    with pytest.raises(NotOffered, match="no deterministic mode"):
        checks.require_offered([missing, missing])
    checks.require_offered([missing, _error(ValueError("m"))])
    with pytest.raises(NotOffered):
        checks.require_offered([missing])
    checks.require_offered([])  # no call at all: nothing says the mode is absent


def test_an_exit_a_rank_captured_says_why_whoever_raised_it() -> None:
    """argparse's bare ``SystemExit(2)`` carries what it printed to stderr; an exit that says why itself (the harness's
    ``os._exit`` in the test process) keeps its own message: the contract's record needs no harness class."""
    from conformance.harness.captured_calls import ProcessExitCalled

    argparse_exit = CapturedError.capture(SystemExit(2), stderr="usage: x\nx: error: unrecognized arguments: --coc-y\n")
    assert argparse_exit.message == ("SystemExit(2) -- argparse exits on a bad or unknown flag: x: error: "
                                     "unrecognized arguments: --coc-y")
    assert CapturedError.capture(SystemExit(3)).message.endswith("nothing printed to stderr")
    assert CapturedError.capture(ProcessExitCalled(0)).message.startswith("os._exit(0) called in the test process")


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


def test_a_failure_recorded_without_raising_fails_the_case_with_its_message_category_and_level() -> None:
    """``Verdicts.fail``: what the explorer records of a failure it found, the same record a raised one leaves."""
    verdicts = Verdicts()
    with verdicts.check("numerics", Level.MUST):
        pass
    verdicts.fail("declared error type", Level.SHOULD, "raised ValueError, declared TypeError",
                  category=WrongError.category)
    assert verdicts.outcome == FAILED
    assert [(r.name, r.outcome, r.level, r.category, r.message) for r in verdicts.results if r.failed] == [
        ("declared error type", FAILED, Level.SHOULD, WrongError.category, "raised ValueError, declared TypeError")]
    (failure,) = verdicts.failed([Level.SHOULD])
    assert isinstance(failure, CheckFailure) and failure.level is Level.SHOULD and str(failure).startswith("raised")
    assert verdicts.failed([Level.MUST]) == []
    raised = Verdicts()
    with raised.check("declared error type", Level.SHOULD):
        raise WrongError("raised ValueError, declared TypeError")
    assert [r.as_dict() | {"seconds": 0} for r in raised.results] == \
        [r.as_dict() | {"seconds": 0} for r in verdicts.results if r.failed]


def test_a_case_keeps_its_evidence_only_when_a_report_keeps_it() -> None:
    """The evidence is the case's own (no collection shared between cases), and costs nothing nobody keeps."""
    dropped, kept = Verdicts(), Verdicts()
    kept.evidence.kept = True
    for verdicts in (dropped, kept):
        verdicts.evidence.text("figures", "perf")
        verdicts.evidence.describe(feature="perf", story="all_gather_matmul")
    assert dropped.evidence.texts == [] and dropped.evidence.description == {}
    assert kept.evidence.texts == [("perf", "figures")] and kept.evidence.description["story"] == "all_gather_matmul"


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
    from conformance.record.failures import WrongError, suite_requires
    from conformance.record.levels import Level
    from conformance.record.verdicts import NotJudged

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


STICKY = """
    import pytest
    from conformance.harness.case_errors import CaseTimeout
    from conformance.record.failures import WrongError
    from conformance.record.levels import Level
    from conformance.record.verdicts import NotJudged, NotOffered

    def _fails(verdicts):
        with verdicts.check("m=1: numerics", Level.MUST):
            raise WrongError("wrong rows at m=1")

    def test_fails_then_skips(verdicts):
        _fails(verdicts)
        pytest.skip("not implemented: odd rows")

    def test_fails_then_not_offered(verdicts):
        _fails(verdicts)
        raise NotOffered("not implemented: odd rows")

    def test_fails_then_not_judged(verdicts):
        _fails(verdicts)
        raise NotJudged("nothing to compare")

    def test_fails_then_xfails(verdicts):
        _fails(verdicts)
        pytest.xfail("looks flaky")

    def test_fails_then_hangs(verdicts):
        _fails(verdicts)
        raise CaseTimeout("did not finish")

    def test_should_fails_then_skips(verdicts):
        with verdicts.check("declared error type", Level.SHOULD):
            raise WrongError("untyped", level=Level.SHOULD)
        pytest.skip("not implemented: the rest")

    def test_sub_cases(verdicts):
        for m in (1, 3, 7):
            with verdicts.sub_case(f"m={m}"):
                if m == 3:
                    raise NotOffered("not implemented: m=3")
                with verdicts.check(f"m={m}: numerics", Level.MUST):
                    if m == 1:
                        raise WrongError("wrong rows at m=1")

    def test_sub_cases_none_offered(verdicts):
        for m in (1, 3):
            with verdicts.sub_case(f"m={m}"):
                raise NotOffered(f"not implemented: m={m}")

    def test_passes_then_not_offered(verdicts):
        with verdicts.check("numerics", Level.MUST):
            pass
        raise NotOffered("not implemented: the rest")

    @pytest.mark.coc_level("MUST")
    def test_not_offered():
        raise NotOffered("not implemented: no such mode")
"""


def test_a_failure_is_sticky_whatever_is_raised_after_it(pytester: pytest.Pytester) -> None:
    """A skip, a refusal, nothing to judge, a hang after a failed check: the case fails, the later event recorded
    beside the failure; sub-cases not offered are recorded and the loop goes on; not offered alone skips."""
    pytester.makepyfile(test_cases=STICKY)
    result, cases = _summary(pytester, "--coc-gate", "MUST")

    def shown(name: str) -> list[tuple[str, str]]:
        return [(c["name"], c["outcome"]) for c in cases[name]["checks"]]

    for name, beside in (("test_fails_then_skips", "not judged"), ("test_fails_then_not_offered", "not offered"),
                         ("test_fails_then_not_judged", "not judged"), ("test_fails_then_xfails", "not judged")):
        assert cases[name]["outcome"] == "failed", cases[name]
        assert shown(name) == [("m=1: numerics", "failed"), (name, beside)], cases[name]
        assert cases[name]["failure"]["type"] == "WrongError" and "wrong rows at m=1" in \
            cases[name]["failure"]["message"], cases[name]
    assert cases["test_fails_then_skips"]["checks"][1]["message"] == "skipped: not implemented: odd rows"
    hang = cases["test_fails_then_hangs"]
    assert hang["outcome"] == "failed" and hang["failure"]["category"] == "hang", hang
    assert [c["outcome"] for c in hang["checks"]] == ["failed", "failed"], hang
    # a failure of a level that does not gate stays visible as such: never a skip
    assert cases["test_should_fails_then_skips"]["outcome"] == "not-gated", cases["test_should_fails_then_skips"]
    assert shown("test_sub_cases") == [("m=1: numerics", "failed"), ("m=3", "not offered"),
                                       ("m=7: numerics", "passed")]
    assert cases["test_sub_cases"]["outcome"] == "failed"
    assert cases["test_passes_then_not_offered"]["outcome"] == "passed"
    assert shown("test_passes_then_not_offered") == [("numerics", "passed"),
                                                     ("test_passes_then_not_offered", "not offered")]
    for name in ("test_sub_cases_none_offered", "test_not_offered"):
        assert cases[name]["outcome"] == "skipped" and cases[name]["skip_reason"].startswith("not implemented: m"
                                                                                          if "sub" in name else
                                                                                          "not implemented: no"), \
            cases[name]
        assert {outcome for _, outcome in shown(name)} == {"not offered"}, cases[name]
    assert result.ret == 1
    levels = json.loads((pytester.path / "summary.json").read_text())["levels"]
    assert levels["MUST:not offered"] == 6 and levels["SHOULD:failed"] == 1, levels  # every one counted
    assert "6 not offered" in result.stdout.str()  # and the terminal's table shows the same count


def test_the_gate_reads_an_unexpected_pass_from_a_real_summary(pytester: pytest.Pytester) -> None:
    from conformance.record import run_diff, runs

    pytester.makepyfile(test_cases=CASES)
    pytester.makefile(".toml", known=EXPECTED)
    _summary(pytester, "--coc-expectations", "known.toml", "-k", "fixed")
    result = run_diff.diff_runs(runs.Run("b", "?", {}), runs.load_run(pytester.path / "summary.json"))
    assert [c["id"] for c in result.unexpected_passes] == ["test_cases.py::test_fixed"]


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


@pytest.mark.parametrize("error, expect, config, outcome", [
    (None, {"enabled": True}, {"enabled": True}, "passed"),
    (None, {"enabled": True}, {"enabled": False}, "failed"),
    (None, {}, {}, "not judged"),
    ("refused", {}, {}, "failed"),  # nothing to compare, but a valid setting refused
    ("refused", {"enabled": True}, {}, "failed"),
])
def test_effective_settings_judge_a_refusal_before_what_there_is_to_compare(
    error: str | None, expect: dict[str, object], config: dict[str, object], outcome: str,
) -> None:
    from types import SimpleNamespace

    from conformance.judge.config_verdicts import judge_effective
    from conformance.record.levels import Level

    verdicts = Verdicts()
    captured = CapturedError("ValueError", error, "") if error else None
    judge_effective(verdicts, SimpleNamespace(**config), captured, expect, Level.MUST, "a valid setting")
    assert [(r.name, r.outcome) for r in verdicts.results] == [("effective settings", outcome)]


@pytest.mark.parametrize("weight_grad, judged", [({}, False), ({"dw": "dummy"}, True)])
def test_fusion_checks_are_not_judged_where_no_rank_recorded_a_weight_gradient(
    weight_grad: dict[str, str], judged: bool,
) -> None:
    """Nothing recorded is nothing compared: not judged, never passed; recorded, the checks judge it."""
    from conformance.contract.results import LayerOutcome, StepRun
    from conformance.judge import layers

    outcomes = [LayerOutcome(None, [[StepRun([], {}, dict(weight_grad))]]) for _ in range(2)]
    for check in (layers.check_fusion_honoured, layers.check_main_grad):
        if judged:
            check(outcomes)
        else:
            with pytest.raises(NotJudged, match="no rank recorded where a weight gradient went"):
                check(outcomes)


def test_pieces_that_are_no_shards_of_one_tensor_fail_the_check_naming_each_ranks_shape() -> None:
    """Reduce-scatter pieces of other shapes on other ranks: the check that assembles them fails (issue 50: the
    assembly raised, a suite error)."""
    import torch

    from conformance.contract.layouts import Split
    from conformance.judge.assembly import assemble
    from conformance.record.failures import ContractViolation

    with pytest.raises(ContractViolation, match=r"rank 0 \[4, 3\], rank 1 \[4, 2\]"):
        assemble([torch.ones(4, 3), torch.ones(4, 2)], Split.SEQ)
    with pytest.raises(ContractViolation, match=r"rank 0 \[4, 3\], rank 1 \[5, 3\]"):
        assemble([torch.ones(4, 3), torch.ones(5, 3)], Split.SEQ)  # torch.cat would have joined these
    assert assemble([torch.ones(4, 3), torch.ones(4, 3)], Split.SEQ).shape == (8, 3)
