"""The terminal's table of requirement levels: every check counted by level and outcome, as ``--coc-gate`` sees it.

Counted on the controller under xdist, from the checks each report carries
(``coc_checks``, written by :mod:`conformance.plugins.level_gate`), by the
record's own rule (:mod:`conformance.record.level_tally`), so the terminal,
the summary, the gate and the report count alike.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest

from conformance.record import level_tally, report_properties
from conformance.record.levels import Level


def checks_of(report: pytest.TestReport) -> list[dict[str, Any]]:
    """The check results a report carries (empty for setup and teardown)."""
    return list(cast(list[dict[str, Any]], report_properties.property_of(report, report_properties.CHECKS) or []))


class LevelTally:
    """Counts every check by level and outcome (on the controller under xdist) and prints them."""

    def __init__(self, gate: frozenset[Level]) -> None:
        self.gate = gate
        self.tally: Counter[tuple[str, str]] = Counter()
        self.ungated: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and not (report.when == "setup" and report.skipped):
            return  # a case skipped at setup (not offered) has no call report
        checks = checks_of(report)
        self.tally.update(level_tally.tally(checks, self.gate))
        for check in checks:
            if level_tally.column(check, self.gate) == level_tally.NOT_GATED:
                self.ungated.append(f"{report.nodeid} [{check['level']}] {check['name']}: {check['message'][:160]}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.tally:
            return
        terminalreporter.section("coc-conformance: requirement levels")
        for line in level_tally.lines(self.tally, self.gate):
            terminalreporter.write_line(line)
        for line in self.ungated[:20]:
            terminalreporter.write_line(f"  not gated: {line}")
        if len(self.ungated) > 20:
            terminalreporter.write_line(f"  ... and {len(self.ungated) - 20} more (see the JSON summary)")
