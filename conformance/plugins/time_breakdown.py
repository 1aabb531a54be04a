"""Where a case's time goes: lease wait, pool start, the implementation, the references, the checks.

Each test gets a fresh :class:`~conformance.harness.runner.CaseTimings` in
its stash before its fixtures run; the ``coc_ranks`` fixture records every
rank run into it; this plugin stores it in the report's
``user_properties`` (``coc_timings``, read by the JSON summary and the Allure
hooks) and prints the totals and the ten slowest cases at the end (on the
controller under xdist).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, cast

import pytest

from conformance import report_properties
from conformance.caseids import needs
from conformance.harness.runner import CaseTimings

timings_key = pytest.StashKey[CaseTimings]()
#: Columns of the breakdown, in print order.
COLUMNS = ("lease_wait", "pool_start", "impl", "reference", "ranks", "checks", "total")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A fresh record, before the case's fixtures (``coc_ranks`` records into it), with what the case needs."""
    need = needs(item)
    item.stash[timings_key] = CaseTimings(world=need.world, exclusive=need.exclusive)


def case_timings(item: pytest.Item) -> CaseTimings:
    """The running case's record (one made on the spot outside a pytest run's setup)."""
    return item.stash.setdefault(timings_key, CaseTimings())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    record = case_timings(item)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        record.total = time.perf_counter() - start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    record = item.stash.get(timings_key, None)
    if call.when == "call" and record is not None and record.runs:
        report.user_properties.append((report_properties.TIMINGS, record.as_dict()))
    return report


def timings_of(report: pytest.TestReport) -> dict[str, Any] | None:
    found = report_properties.property_of(report, report_properties.TIMINGS)
    return None if found is None else dict(cast(dict[str, Any], found))


class TimeTally:
    """Totals and the slowest cases, printed in the terminal summary."""

    def __init__(self) -> None:
        self.cases: list[tuple[str, dict[str, Any]]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and (found := timings_of(report)) is not None:
            self.cases.append((report.nodeid, found))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.cases:
            return
        totals = {c: sum(t.get(c, 0.0) for _, t in self.cases) for c in COLUMNS}
        pools = sum(t.get("pools_started", 0) for _, t in self.cases)
        worst_wait = max(t.get("longest_lease_wait", t.get("lease_wait", 0.0)) for _, t in self.cases)
        terminalreporter.section("coc-conformance: where the time went")
        terminalreporter.write_line(
            f"{len(self.cases)} distributed cases: " + ", ".join(f"{c} {totals[c]:.1f} s" for c in COLUMNS)
            + f"; {pools} pool start(s); longest single lease wait {worst_wait:.2f} s")
        header = " ".join(f"{c:>10}" for c in COLUMNS)
        terminalreporter.write_line(f"{header}  slowest cases")
        for nodeid, t in sorted(self.cases, key=lambda c: -c[1].get("total", 0.0))[:10]:
            row = " ".join(f"{t.get(c, 0.0):>10.2f}" for c in COLUMNS)
            terminalreporter.write_line(f"{row}  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimeTally(), "coc-time-tally")
