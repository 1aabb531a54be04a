"""A case's checks as Allure steps: ``[MUST] numerics: failed``, why a case was skipped, known or not gated, and
the failure's header (its failed checks, the message, the command that reproduces it, the check's own frames).

Steps are written into allure-pytest's open result of the running case; only
passed checks are "passed", and a case that judged nothing is shown skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conformance.record.verdicts import FAILED, NOT_JUDGED, PASSED, outcome_of
from conformance.record.verdicts import case_outcome as outcome_of_checks
from conformance.reporting.allure import recording

if TYPE_CHECKING:
    import pytest

#: What a case that did not pass is, as the suite reports it (the summary's outcomes).
KNOWN, NOT_GATED = "known", "not-gated"
#: Allure's status for each check outcome; anything else (not judged, a newer outcome) is never "passed".
_STEP_STATUS = {PASSED: "passed", FAILED: "failed"}


def check_outcome(check: Mapping[str, Any], case_outcome: str) -> str:
    """A check's outcome as the report shows it: a failed check of a known or ungated case says so."""
    outcome = outcome_of(check)
    if outcome == FAILED and case_outcome in (KNOWN, NOT_GATED):
        return "known" if case_outcome == KNOWN else "failed, not gated"
    return outcome


def _open_result(config: pytest.Config) -> Any:
    """allure-pytest's result of the running case (None when it records none)."""
    listener = config.pluginmanager.get_plugin("allure_listener")
    return listener.allure_logger.get_test(None) if listener is not None else None


def _step(result: Any, name: str, status: str, message: str = "", seconds: float | None = None) -> None:
    """A step ending now; ``seconds`` long when known (Allure shows a step without a time as "unknown")."""
    from allure_commons.model2 import StatusDetails, TestStepResult
    from allure_commons.utils import now

    stop = now()
    start = None if seconds is None else stop - round(seconds * 1000)
    result.steps.append(TestStepResult(name=name, status=status, start=start, stop=None if start is None else stop,
                                       statusDetails=StatusDetails(message=message) if message else None))


def check_title(check: Mapping[str, Any], case_outcome: str) -> str:
    """``[MUST] numerics: failed``: a check's step title, and the first line of a failed case's message."""
    return f"[{check['level']}] {check['name']}: {check_outcome(check, case_outcome)}"


def show_checks(config: pytest.Config, checks: Sequence[Mapping[str, Any]], case_outcome: str,
                call_seconds: float | None = None) -> None:
    """One step per check, ``[MUST] numerics: failed``, with its message and the time it took; only passed
    checks are "passed".  A check recorded from the test body itself (no time of its own) took the call's
    time when it is the case's only check."""
    result = _open_result(config) if recording.is_active() else None
    if result is None:
        return
    for check in checks:
        outcome = check_outcome(check, case_outcome)
        seconds = check.get("seconds")
        if seconds is None and len(checks) == 1:
            seconds = call_seconds
        _step(result, check_title(check, case_outcome), _STEP_STATUS.get(outcome, "skipped"),
              str(check.get("message") or ""), seconds)


def show_reason(config: pytest.Config, what: str, reason: str, seconds: float | None = None) -> None:
    """Why a case was skipped, known, not gated or not judged: a step above its checks (Allure shows no
    message at the top of a skipped case), as long as the phase that decided it (``seconds``)."""
    result = _open_result(config) if recording.is_active() else None
    if result is not None:
        _step(result, f"{what}: {reason}", "skipped", seconds=seconds)
        result.steps.insert(0, result.steps.pop())


def not_judged(config: pytest.Config, checks: Sequence[Mapping[str, Any]]) -> None:
    """A case that judged nothing (``case_outcome``: not judged) is shown skipped, with why, never as passed."""
    from allure_commons.model2 import Status, StatusDetails

    result = _open_result(config) if recording.is_active() else None
    if result is None or not checks or outcome_of_checks(outcome_of(c) for c in checks) != NOT_JUDGED:
        return
    why = "; ".join(f"{c['name']}: {c.get('message') or 'nothing to judge'}" for c in checks)
    result.status = Status.SKIPPED
    result.statusDetails = StatusDetails(message=f"{NOT_JUDGED}: {why}")


def show_failure(config: pytest.Config, command: str, frames: str | None,
                 checks: Sequence[Mapping[str, Any]] = (), case_outcome: str = "failed") -> None:
    """The failed checks with their levels first (the header of the case), then the message, the command that
    reproduces the case, and the traceback cut to the check's frames; shown once more in the failed check's step
    (the same details: Allure then shows them nowhere else)."""
    result = _open_result(config) if recording.is_active() else None
    details = getattr(result, "statusDetails", None)
    if result is None or details is None:
        return
    failed = "; ".join(check_title(c, case_outcome) for c in checks if outcome_of(c) == FAILED)
    details.message = "\n".join(filter(None, [failed, f"{details.message or ''}\n\nreproduce: {command}".lstrip()]))
    if frames is not None:
        details.trace = frames
    step = next((step for step in result.steps if step.status == "failed"), None)
    if step is not None:
        step.statusDetails = details
