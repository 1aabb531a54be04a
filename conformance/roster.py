"""The roll of a session's cases: what was collected, what crashed workers took with them, and who sees it.

Under xdist the controller collects nothing itself: each worker reports its
collection, and pytest-xdist names the case a dying worker was running.  The
JSON summary and the Allure results both account for every collected case
from this one roll (:func:`roster`).
"""

from __future__ import annotations

from typing import Any

import pytest


def is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker (the controller sees every case; a worker only its own)."""
    return hasattr(config, "workerinput")


class CaseRoster:
    """Collected node ids, and the ones whose worker died while running them."""

    def __init__(self) -> None:
        self.collected: list[str] = []
        self.crashed: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.collected:
            self.collected = [item.nodeid for item in session.items]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.collected:  # every worker collects the same cases
            self.collected = list(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        self.crashed.append(crashitem)


_ROSTER = pytest.StashKey[CaseRoster]()


def roster(config: pytest.Config) -> CaseRoster:
    """This session's roll (empty on an xdist worker until it has collected)."""
    return config.stash[_ROSTER]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ROSTER] = case_roster = CaseRoster()
    config.pluginmanager.register(case_roster, "coc-case-roster")
