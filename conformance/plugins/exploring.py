"""Which of the explorer's tests run: only the explorer with ``--coc-explore``, only the replay with
``--coc-replay``, neither otherwise (deselected, so a normal run counts them nowhere).

Also prints, at the end, what an exploration did (cases, cases per second,
where the time went) and each minimal failing case with its replay command.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance import options
from conformance.case_kinds import EXPLORE, declared_kind
from conformance.record import report_properties
from conformance.record.report_properties import property_of
from conformance.roster import is_xdist_worker

#: The test of the suite's explorer cases (kind ``explore``) each option runs.
EXPLORE_TEST, REPLAY_TEST = "test_explore", "test_replay"


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(options.EXPLORE) is not None and config.getoption(options.REPLAY) is not None:
        raise pytest.UsageError(f"{options.EXPLORE} and {options.REPLAY} exclude each other: explore, or replay")
    if config.getoption(options.REPLAY) is not None:
        from conformance.explore.finding import load_finding
        from conformance.explore.spec import SpecError

        try:
            load_finding(config.getoption(options.REPLAY))
        except SpecError as exc:
            raise pytest.UsageError(f"{options.REPLAY}: {exc}") from None
    if config.getoption(options.EXPLORE) is not None and not is_xdist_worker(config):
        config.pluginmanager.register(ExplorationSummary(), "coc-exploration-summary")


def _explorer_test(item: pytest.Item) -> str | None:
    name = getattr(item, "originalname", item.name)
    return name if declared_kind(item) == EXPLORE and name in (EXPLORE_TEST, REPLAY_TEST) else None


@pytest.hookimpl(tryfirst=True)  # before scheduling, which preloads megatron-core only if a kept case needs it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = (EXPLORE_TEST if config.getoption(options.EXPLORE) is not None
              else REPLAY_TEST if config.getoption(options.REPLAY) is not None else None)
    keep = [item for item in items if _explorer_test(item) == wanted]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if _explorer_test(item) != wanted])
        items[:] = keep


class ExplorationSummary:
    """Prints each exploration's figures and findings at the end of the run (on the controller)."""

    def __init__(self) -> None:
        self.explorations: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        explored = property_of(report, report_properties.EXPLORE)
        if explored is not None and report.when == "call":
            self.explorations.append(explored)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for e in self.explorations:
            t = e["time_s"]
            terminalreporter.section("coc-conformance: exploration")
            terminalreporter.write_line(
                f"seed {e['seed']}: {e['cases']} cases in {t['exploring']} s ({e['cases_per_s']} cases/s), "
                f"{e['shrink_cases']} more while shrinking ({t['shrinking']} s); time: ranks {t['ranks']} s "
                f"(implementation {t['implementation']}, references {t['references']}), judging {t['judging']} s, "
                f"overhead {t['overhead']} s")
            for kind, figures in e.get("per_kind", {}).items():
                terminalreporter.write_line(f"  {kind}: {figures['cases']} cases in {figures['seconds']} s "
                                            f"({figures['cases_per_s']} cases/s)")
            if e.get("from_corpus") or e.get("mutations"):
                terminalreporter.write_line(f"  {e['from_corpus']} cases replayed from the corpus, "
                                            f"{e['mutations']} mutations of its cases")
            for kind, why in e.get("not_offered", {}).items():
                terminalreporter.write_line(f"  {kind}: not explored ({why})")
            for why, count in e.get("outside", {}).items():
                terminalreporter.write_line(f"  {count} draws set aside, not run: {why}")
            for f in e["findings"]:
                terminalreporter.write_line(f"{f['level']} {f['check']!r} ({f['category']}): {f['case']}"
                                            f"{'' if f['minimal'] else ' (not proved minimal)'}", red=True)
                terminalreporter.write_line(f"    replay: {f['command']}")
