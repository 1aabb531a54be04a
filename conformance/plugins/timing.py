"""Where a case's time goes: lease wait, pool start, the implementation, the references, the checks.

The rank runner fills a :class:`~conformance.harness.runner.CaseTimings` per
test; this plugin gives each test a fresh one, stores it in the report's
``user_properties`` (``coc_timings``, read by the JSON summary and the Allure
hooks) and prints the totals and the ten slowest cases at the end (on the
controller under xdist).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, cast

import pytest

from conformance.harness.runner import CaseTimings

TIMINGS_PROPERTY = "coc_timings"
timings_key = pytest.StashKey[CaseTimings]()
#: Columns of the breakdown, in print order.
COLUMNS = ("lease_wait", "pool_start", "impl", "reference", "ranks", "checks", "total")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    from conformance.plugin import runner_key

    record = CaseTimings()
    item.stash[timings_key] = record
    runner = item.config.stash.get(runner_key, None)
    if runner is not None:
        runner.timings = record
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
        report.user_properties.append((TIMINGS_PROPERTY, record.as_dict()))
    return report


def timings_of(report: pytest.TestReport) -> dict[str, Any] | None:
    for name, value in report.user_properties:
        if name == TIMINGS_PROPERTY:
            return dict(cast(dict[str, Any], value))
    return None


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
