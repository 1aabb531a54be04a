"""Known outcomes (``--coc-expectations FILE``): a gate that is red only when something changed.

An implementation with known non-conformances would otherwise stay red
forever.  The file (TOML, :mod:`conformance.gating.expectations`) maps case-id
patterns to an expected outcome -- ``fail``, ``hang`` or ``skip`` -- with a
reason and a link:

* ``skip``: the case is not run; it is reported skipped with the reason;
* ``fail`` / ``hang``: a case that fails that way is reported as a known
  failure (``xfailed``, reason ``known: ...``); one that fails the other way
  fails ("expected fail, got hang"); one that passes is an *unexpected pass*
  and fails the gate until the file is updated.

Each matched report carries ``coc_expectation`` in its user properties (the
JSON summary shows it).
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from conformance import options, report_properties
from conformance.caseids import case_id
from conformance.gating.expectations import Expectation, Expectations, ExpectationsError
from conformance.harness.case_errors import HANGS

expectations_key = pytest.StashKey[Expectations]()
matched_key = pytest.StashKey[Expectation]()


def pytest_configure(config: pytest.Config) -> None:
    path = options.expectations_path(config)
    if path is None:
        return
    try:
        config.stash[expectations_key] = Expectations.load(path)
    except ExpectationsError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_runtest_setup(item: pytest.Item) -> None:
    known = item.config.stash.get(expectations_key, None)
    if known is None:
        return
    found = known.match(case_id(item.nodeid))
    if found is None:
        return
    item.stash[matched_key] = found
    if found.outcome == "skip":
        pytest.skip(f"known skip: {found.describe()}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    found = item.stash.get(matched_key, None)
    if found is None or call.when != "call":
        return report
    report.user_properties.append((report_properties.EXPECTATION, {"pattern": found.pattern, "outcome": found.outcome,
                                                       "reason": found.reason, "link": found.link}))
    if hasattr(report, "wasxfail"):  # already an expected failure (a level that does not gate)
        return report
    if report.passed:
        report.outcome = "failed"
        report.longrepr = (f"unexpected pass: {case_id(item.nodeid)} was expected to {found.outcome} "
                           f"({found.describe()}); remove or update the entry {found.pattern!r} in "
                           f"{options.expectations_path(item.config)}")
        return report
    if report.failed and call.excinfo is not None:
        hung = isinstance(call.excinfo.value, HANGS)
        if (found.outcome == "hang") == hung:
            report.outcome = "skipped"
            report.wasxfail = f"known {found.outcome}: {found.describe()}"
        else:
            got = "hang" if hung else "fail"
            report.longrepr = (f"expected {found.outcome}, got {got} ({found.describe()}):\n"
                               f"{report.longreprtext}")
    return report
