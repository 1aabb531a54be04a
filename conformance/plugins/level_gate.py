"""Requirement levels in pytest: every check's level recorded, ``--coc-gate`` choosing what fails.

A test states its checks' level with ``@pytest.mark.coc_level("SHOULD")`` (default
MUST) or per check through the ``verdicts`` fixture.  After the test body:

* a failed check whose level gates fails the test (all failed checks named);
* failed checks whose levels do not gate make the test an expected failure
  (``xfailed``, reason ``[SHOULD, not gated] ...``), so the run stays green and
  the failure stays visible;
* every check's outcome goes into the report's ``user_properties``
  (``coc_checks``), which the JSON summary, the Allure hooks and the terminal's
  table of levels (:mod:`conformance.plugins.level_table`) read (under xdist, on the controller).

Failures are sticky (``docs/DESIGN.md#requirement-levels``): the case's
outcome follows from everything it recorded by one rule,
:func:`~conformance.record.verdicts.case_outcome`, here and nowhere else.  A
skip, a :class:`~conformance.record.verdicts.NotOffered`, a
:class:`~conformance.record.verdicts.NotJudged` raised after a check failed is
recorded beside that failure (``not offered`` / ``not judged``, with its
reason), never instead of it; hangs, storm breaks and timeouts are failures
themselves.  A case whose every record is ``not offered`` is skipped as not
offered (:func:`skip_not_offered`), and so is one skipped at setup because the
implementation lacks an op: either way the report carries a ``not offered``
check, so every count (terminal, summary, matrix, gate) shows it.

Hangs, crashes and unexpected rank errors are always MUST: no implementation
may hang or die, whatever it declares.  Any other exception from a test body
(not a check failure, not an assertion) is the suite's own bug: it is raised
as :class:`~conformance.record.failures.SuiteError` and reported as an *error*
of the run, never as a failed check of the implementation; the checks recorded
before it are kept, and a gated check that failed before it makes the case
failed (the worse verdict), the suite's error recorded beside it.  A test that
passes with no check recorded is one check passed only when it judges by its
own assertions (no ``verdicts``); one that judges through ``verdicts`` and
recorded nothing was not judged, and a case whose every check was not judged
is reported as such (outcome ``not judged`` in the JSON summary), never as a
pass.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import NoReturn

import pytest

from conformance import options
from conformance.harness.case_errors import CaseError
from conformance.record import report_properties
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import CheckFailure, SuiteError
from conformance.record.item_verdicts import verdicts_key, verdicts_of
from conformance.record.levels import Level
from conformance.record.verdicts import (
    FAILED,
    NOT_JUDGED,
    NOT_OFFERED,
    PASSED,
    CheckResult,
    NotJudged,
    NotOffered,
    Verdicts,
)

gate_key = pytest.StashKey[frozenset[Level]]()


def pytest_configure(config: pytest.Config) -> None:
    try:
        config.stash[gate_key] = Level.parse_many(options.gate_spec(config))
    except ValueError as exc:
        raise pytest.UsageError(f"{options.GATE}: {exc}") from None
    refuse_reruns(config)
    from conformance.plugins.level_table import LevelTally

    config.pluginmanager.register(LevelTally(config.stash[gate_key]), "coc-level-tally")


def refuse_reruns(config: pytest.Config) -> None:
    """A run of the suite asking pytest-rerunfailures to run failed cases again is a usage error: a failed attempt
    is a verdict, and a rerun that skipped or passed would report it lost (skipped, exit 0) -- failures are
    sticky across attempts too."""
    from conformance.plugins.scheduling import runs_the_suite

    asked = [config.getoption(name, None) for name in ("reruns", "force_reruns")]
    try:
        asked.append(config.getini("reruns"))
    except ValueError:  # pytest-rerunfailures is not installed
        pass
    rerun = [str(value) for value in asked if value is not None and str(value).strip() not in ("", "0")]
    if rerun and runs_the_suite(config):
        raise pytest.UsageError(f"reruns ({', '.join(rerun)}; pytest-rerunfailures) are refused by coc-conformance: "
                                "a failed attempt is a verdict, and a rerun would report it lost; run the suite "
                                "without --reruns")


#: Fixtures that make a test a conformance check (its outcome is counted by level).
CHECK_FIXTURES = frozenset({"coc_impl", "coc_ranks", "coc_declarations", "verdicts"})


def is_check(item: pytest.Item) -> bool:
    """Whether ``item`` judges an implementation (uses the suite's fixtures or names a level)."""
    return bool(CHECK_FIXTURES.intersection(getattr(item, "fixturenames", ()))) or \
        item.get_closest_marker("coc_level") is not None


def default_level(item: pytest.Item) -> Level:
    """The level of a test's checks that do not name one (marker ``coc_level``, else MUST)."""
    mark = item.get_closest_marker("coc_level")
    return Level(mark.args[0]) if mark else Level.MUST


def failure_level(item: pytest.Item, exc: BaseException) -> Level:
    """The level a failure raised straight from a test body holds the implementation to."""
    if isinstance(exc, CaseError):
        return Level.MUST  # hangs, crashes, unexpected rank errors
    if isinstance(exc, CheckFailure) and exc.explicit_level is not None:
        return exc.explicit_level
    return default_level(item)


def is_verdict(exc: BaseException) -> bool:
    """Whether an exception from a test body judges the implementation (else it is the suite's own bug)."""
    return isinstance(exc, (CheckFailure, AssertionError, CaseError))


@pytest.fixture
def verdicts(request: pytest.FixtureRequest) -> Verdicts:
    """The test's named checks: ``with verdicts.check("numerics", Level.MUST): ...``."""
    return verdicts_of(request.node)


@pytest.fixture
def case_evidence(request: pytest.FixtureRequest) -> CaseEvidence:
    """What a test that judges by its own assertions saw, for the report (its record's evidence)."""
    return verdicts_of(request.node).evidence


def judges_through_verdicts(item: pytest.Item) -> bool:
    """Whether the test records its checks through ``verdicts`` (else its body is its one check)."""
    return "verdicts" in getattr(item, "fixturenames", ())


#: Why a case is skipped as not offered (set by :func:`skip_not_offered`).
not_offered_key = pytest.StashKey[str]()


def skip_not_offered(item: pytest.Item, reason: str) -> NoReturn:
    """Skip ``item`` because the implementation does not offer what it needs (it lacks the op, or every rank
    raised ``NotImplementedError``): its report carries a ``not offered`` check (at setup too)."""
    item.stash[not_offered_key] = reason
    pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    name = getattr(item, "originalname", item.name)
    try:
        yield
    except BaseException as exc:
        if not is_check(item):
            raise  # not a conformance check (another test of the session): what it raises is its own outcome
        if isinstance(exc, (pytest.skip.Exception, pytest.xfail.Exception)):
            _record_the_skip(item, name, exc)
            conclude(item, refusal=exc)
        if not isinstance(exc, Exception):
            raise
        if isinstance(exc, NotOffered):
            found = verdicts_of(item)
            if not any(r.outcome == NOT_OFFERED for r in found.results):  # else it recorded what it lacks already
                found.not_offered(name, default_level(item), str(exc))
        elif isinstance(exc, NotJudged):
            verdicts_of(item).not_judged(name, default_level(item), str(exc))
        elif not is_verdict(exc):
            raise (exc if isinstance(exc, SuiteError) else SuiteError.wrapping(item.nodeid, exc)) from exc
        else:
            category = exc.category if isinstance(exc, CheckFailure) else type(exc).__name__
            verdicts_of(item).fail(name, failure_level(item, exc), _first_line(exc), category=category, error=exc)
            raise
    conclude(item)


def _record_the_skip(item: pytest.Item, name: str, skip: BaseException) -> None:
    """A skip raised after checks were recorded: recorded beside them (why the rest was not judged)."""
    recorded = item.stash.get(verdicts_key, None)
    if recorded is not None and recorded.results:
        recorded.not_judged(name, default_level(item), f"skipped: {_first_line(skip)}")


def conclude(item: pytest.Item, refusal: BaseException | None = None) -> None:
    """The case's outcome from its record, by :func:`~conformance.record.verdicts.case_outcome`: failed, its failed
    checks raised (those of gating levels first; none gating: the report makes it an expected failure); else the
    ``refusal`` (a skip) raised again; else, when every record is not offered, skipped as not offered."""
    recorded = item.stash.get(verdicts_key, None)
    if recorded is None:
        if refusal is not None:
            raise refusal
        return
    if recorded.outcome == FAILED:
        failed, gating = recorded.failed(), recorded.failed(item.config.stash[gate_key])
        raise _combined(gating + [f for f in failed if f not in gating], len(failed))
    if refusal is not None:
        raise refusal
    if recorded.outcome == NOT_OFFERED:
        skip_not_offered(item, "; ".join(dict.fromkeys(r.message for r in recorded.results)))


def _combined(failures: list[BaseException], total: int) -> BaseException:
    """The first gating failure, its message followed by the other failed checks'."""
    first = failures[0]
    if total == 1:
        return first
    others = "\n".join(f"also failed: {type(f).__name__}: {_first_line(f)}" for f in failures[1:])
    text = f"{first}\n{others}" if others else str(first)
    combined = type(first)(text) if isinstance(first, CheckFailure) else AssertionError(text)
    if isinstance(first, CheckFailure) and isinstance(combined, CheckFailure):
        combined.explicit_level = first.explicit_level
    return combined


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, SuiteError):
        _suite_error(item, report, call.excinfo.value)
        return report
    if call.when == "setup" and report.skipped and not_offered_key in item.stash:
        name = getattr(item, "originalname", item.name)
        check = CheckResult(name, default_level(item), NOT_OFFERED, item.stash[not_offered_key])
        report.user_properties.append((report_properties.CHECKS, [check.as_dict()]))
        return report
    if call.when != "call" or not is_check(item):
        return report
    recorded = item.stash.get(verdicts_key, None)
    results = list(recorded.results) if recorded is not None else []
    if not results and report.passed:
        name = getattr(item, "originalname", item.name)
        if not judges_through_verdicts(item):  # it judges by its own assertions: its body is its one check
            results = [CheckResult(name, default_level(item), PASSED)]
        else:  # it judges through ``verdicts`` and recorded nothing: nothing was judged, which is no pass
            results = [CheckResult(name, default_level(item), NOT_JUDGED, "the test recorded no check")]
    if results:
        report.user_properties.append((report_properties.CHECKS, [r.as_dict() for r in results]))
    gate = item.config.stash[gate_key]
    failed = [r for r in results if r.failed]
    if report.failed and failed and all(r.level not in gate for r in failed) and not hasattr(report, "wasxfail"):
        report.outcome = "skipped"
        levels = ", ".join(sorted({r.level.value for r in failed}))
        report.wasxfail = f"[{levels}, not gated] " + "; ".join(f"{r.name}: {r.message}" for r in failed)
        report.user_properties.append((report_properties.NOT_GATED, sorted({r.level.value for r in failed})))
    return report


def _suite_error(item: pytest.Item, report: pytest.TestReport, error: SuiteError) -> None:
    """A bug of the suite stopped the case: every check recorded before it is kept, and the case is the worse of the
    two -- failed when a check of a gating level failed (the suite's error recorded beside it), else an error of
    the run naming the suite."""
    recorded = item.stash.get(verdicts_key, None)
    results = list(recorded.results) if recorded is not None else []
    if results:
        report.user_properties.append((report_properties.CHECKS, [r.as_dict() for r in results]))
    gate = item.config.stash[gate_key]
    if any(r.failed and r.level in gate for r in results):
        report.user_properties.append((report_properties.SUITE_ERROR_BESIDE, str(error)))
    else:
        report.user_properties.append((report_properties.SUITE_ERROR, str(error)))


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """A bug of the suite is an error of the run, not a failure of the implementation."""
    if getattr(report, "when", None) == "call" and report.failed and \
            report_properties.property_of(report, report_properties.SUITE_ERROR):
        return "error", "E", "ERROR"
    return None
