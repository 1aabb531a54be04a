"""The roll of a session's cases: what was collected, what crashed workers took with them, and who sees it.

Under xdist the controller collects nothing itself: each worker reports its
collection, and pytest-xdist names the case a dying worker was running.  The
JSON summary and the Allure results both account for every collected case
from this one roll (:func:`roster`), and both carry the session's run id
(:func:`run_id`, made by the controller and handed to its workers), so a
report never takes one run's verdict for another's results.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

#: ``workerinput`` key: the controller's run id.
_RUN_ID = "coc_run_id"


def is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is an xdist worker (the controller sees every case; a worker only its own)."""
    return hasattr(config, "workerinput")


class CaseRoster:
    """Collected node ids, and the ones whose worker died while running them."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
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
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[_RUN_ID] = self.run_id

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        self.crashed.append(crashitem)


_ROSTER = pytest.StashKey[CaseRoster]()


def roster(config: pytest.Config) -> CaseRoster:
    """This session's roll (empty on an xdist worker until it has collected)."""
    return config.stash[_ROSTER]


def run_id(config: pytest.Config) -> str:
    """This session's id: the same on the controller and every worker, different for every run."""
    return roster(config).run_id


def new_run_id() -> str:
    """When the run started (UTC, to the second) and 6 random hex digits: readable, and unique."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def pytest_configure(config: pytest.Config) -> None:
    given = getattr(config, "workerinput", {}).get(_RUN_ID)
    config.stash[_ROSTER] = case_roster = CaseRoster(str(given) if given else new_run_id())
    config.pluginmanager.register(case_roster, "coc-case-roster")
