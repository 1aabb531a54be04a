"""Known outcomes (``--coc-expectations FILE``): a gate that is red only when something changed.

An implementation with known non-conformances would otherwise stay red
forever.  The file (TOML, :mod:`conformance.gating.expectations`) maps case-id
patterns -- and, preferably, the checks inside a case -- to an expected
outcome (``fail``, ``hang`` or ``skip``) with a reason and a link:

* ``skip`` (whole cases only): the case is not run; it is reported skipped with the reason;
* ``fail`` / ``hang``: a case whose failed checks are all expected, that way,
  is reported as a known failure (``xfailed``, reason ``known: ...``); a
  failed check no entry names fails the case as before, so a known failure
  of one check never hides another; an entry whose checks passed is an
  *unexpected pass* and fails the case until the file is updated.
* ``unjudged`` changes nothing in the run: the JSON summary carries every
  entry, and ``coc-gate`` takes a loss of judgment an entry names as expected.

Each matched report carries ``coc_expectation`` in its user properties (the
JSON summary shows it); an unexpected pass carries its failure as data
(``coc_failure``, category ``unexpected pass``) for ``coc-gate``.  An entry
that matches no case of the run, or names no check its cases recorded, is
stale (:func:`~conformance.record.expected.stale`): listed at the end of the
run and in the summary (``stale_expectations``), a warning in a partial run,
a failure of a run of the whole suite (and red in ``coc-gate``).
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from conformance import options
from conformance.caseids import case_id
from conformance.gating.expectations import Expectations, ExpectationsError, judge_checks
from conformance.harness.case_errors import HANGS
from conformance.record import report_properties
from conformance.record.expected import Expectation
from conformance.record.failures import UNEXPECTED_PASS
from conformance.roster import is_xdist_worker

expectations_key = pytest.StashKey[Expectations]()
matched_key = pytest.StashKey[list[Expectation]]()


def pytest_configure(config: pytest.Config) -> None:
    path = options.expectations_path(config)
    if path is None:
        return
    try:
        config.stash[expectations_key] = Expectations.load(path)
    except ExpectationsError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not is_xdist_worker(config):
        config.pluginmanager.register(StaleEntries(config), "coc-stale-expectations")


#: What the run found of its expectations file: its stale entries (:func:`~conformance.record.expected.stale`) and
#: whether the run was the whole suite (then they fail it).
stale_key = pytest.StashKey[tuple[list[str], bool]]()


class StaleEntries:
    """Entries of the expectations file that match no case of the run, or name no check its cases recorded (on the
    controller under xdist): a warning in a partial run; in a run of the whole suite, where they can only be stale,
    a failure of the run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.checks: dict[str, list[str]] = {}
        self.deselected = 0

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += len(items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        names = [str(c["name"]) for c in report_properties.property_of(report, report_properties.CHECKS) or ()]
        self.checks.setdefault(case_id(report.nodeid), []).extend(names)

    @pytest.hookimpl(tryfirst=True)  # before the summary is written
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from conformance.record.expected import stale
        from conformance.roster import roster

        cases = {case_id(nodeid): self.checks.get(case_id(nodeid), []) for nodeid in roster(self.config).collected}
        found = stale(self.config.stash[expectations_key].entries, cases)
        full = self.full_run()
        self.config.stash[stale_key] = (found, full)
        if found and full and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def full_run(self) -> bool:
        """Whether the run was the whole suite: every case of it collected and none deselected."""
        from conformance.caseids import SUITE_DIR

        config = self.config
        if self.deselected or config.getoption("keyword") or config.getoption("markexpr"):
            return False
        whole = [arg for arg in config.args if str(arg) == "conformance.suite" and config.getoption("pyargs", False)
                 or Path(config.invocation_params.dir, str(arg)).resolve() == SUITE_DIR]
        return bool(whole) and len(whole) == len(config.args)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        found, full = self.config.stash.get(stale_key, ([], False))
        if not found:
            return
        terminalreporter.section("coc-conformance: stale expectations")
        for entry in found:
            terminalreporter.write_line(entry, red=full, yellow=not full)
        terminalreporter.write_line("a run of the whole suite fails on them: remove or fix the entries" if full
                                    else "(a partial run: a warning; a run of the whole suite fails on them)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    known = item.config.stash.get(expectations_key, None)
    if known is None:
        return
    found = known.matching(case_id(item.nodeid))
    if not found:
        return
    item.stash[matched_key] = found
    whole = next((entry for entry in found if entry.whole_case), None)
    if whole is not None and whole.outcome == "skip":
        pytest.skip(f"known skip: {whole.describe()}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    found = item.stash.get(matched_key, None)
    if found is None or call.when != "call":
        return report
    whole = next((entry for entry in found if entry.whole_case), None)
    used = [whole] if whole is not None else found
    report.user_properties.append((report_properties.EXPECTATION, [entry.as_dict() for entry in used]))
    hung = call.excinfo is not None and isinstance(call.excinfo.value, HANGS)
    if whole is not None:
        _whole_case(item, report, whole, hung)
    else:
        _per_check(item, report, found, hung)
    return report


def _whole_case(item: pytest.Item, report: pytest.TestReport, found: Expectation, hung: bool) -> None:
    if hasattr(report, "wasxfail"):  # already an expected failure (a level that does not gate)
        return
    if report.passed:
        _unexpected_pass(item, report, f"{case_id(item.nodeid)} was expected to {found.outcome} "
                                       f"({found.describe()}); remove or update the entry {found.pattern!r}")
    elif report.failed and not report_properties.property_of(report, report_properties.SUITE_ERROR):
        if (found.outcome == "hang") == hung:
            report.outcome = "skipped"
            report.wasxfail = f"known {found.outcome}: {found.describe()}"
        else:
            got = "hang" if hung else "fail"
            report.longrepr = (f"expected {found.outcome}, got {got} ({found.describe()}):\n"
                               f"{report.longreprtext}")


def _per_check(item: pytest.Item, report: pytest.TestReport, entries: list[Expectation], hung: bool) -> None:
    checks = report_properties.property_of(report, report_properties.CHECKS) or []
    verdict = judge_checks(entries, checks, hung=hung)
    if verdict.unexpected_passes:
        check, entry = verdict.unexpected_passes[0]
        _unexpected_pass(item, report, f"check {check['name']!r} of {case_id(item.nodeid)} was expected to "
                                       f"{entry.outcome} ({entry.describe()}); remove or update the entry "
                                       f"{entry.pattern!r} / {entry.check or entry.level!r}")
        return
    if not report.failed or report_properties.property_of(report, report_properties.SUITE_ERROR):
        return
    if verdict.known and not verdict.new:
        report.outcome = "skipped"
        report.wasxfail = "known: " + "; ".join(f"{check['name']}: {entry.outcome}, {entry.describe()}"
                                               for check, entry in verdict.known)
    elif verdict.known:
        report.longrepr = (f"new failure beside known ones: {', '.join(repr(c['name']) for c in verdict.new)} "
                           f"(known: {', '.join(repr(c['name']) for c, _ in verdict.known)}):\n"
                           f"{report.longreprtext}")


def _unexpected_pass(item: pytest.Item, report: pytest.TestReport, what: str) -> None:
    message = f"{UNEXPECTED_PASS}: {what} in {options.expectations_path(item.config)}"
    report.outcome = "failed"
    report.longrepr = message
    if hasattr(report, "wasxfail"):
        del report.wasxfail
    report.user_properties.append((report_properties.FAILURE, {
        "category": UNEXPECTED_PASS, "type": "UnexpectedPass", "message": message}))
