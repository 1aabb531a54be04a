"""The storm breaker: a capability that keeps hanging or crashing stops costing a timeout per case.

A broken patch typically deadlocks or kills a rank in *every* case of an op or
layer kind.  Each such case costs its budget plus a pool rebuild; over a whole
suite that adds up to hours.  So after ``--coc-storm N`` hangs or crashes in a
row of one capability (its op, or its layer kind), the remaining cases of that
capability fail at once, without running: each names the earlier hangs and is
filed under "hang / timeout".  Nothing is skipped silently, and other
capabilities keep running.  A case of the capability that finishes (pass or an
ordinary failure) resets the count; one that skips neither counts nor resets.

Under xdist every worker sees the same count: outcomes are appended to one
file in a directory the controller shares with its workers.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from conformance import options
from conformance.caseids import capability
from conformance.harness.case_errors import HANGS, StormBroken

_SHARED = "coc_shared_dir"
breaker_key = pytest.StashKey["StormBreaker"]()
#: Why a case's capability is in a storm (set while the case runs; its first rank run fails with it).
stormed_key = pytest.StashKey[str]()


class StormBreaker:
    """Hang and crash counts per capability, shared through ``directory``."""

    def __init__(self, directory: Path, limit: int) -> None:
        self.limit = limit
        self.log = directory / "storm.jsonl"
        self.lock = FileLock(str(directory / "storm.lock"))

    def _history(self, what: str) -> list[dict[str, str]]:
        try:
            lines = self.log.read_text().splitlines()
        except OSError:
            return []
        return [e for e in map(json.loads, lines) if e["capability"] == what]

    def recent_hangs(self, what: str) -> list[str]:
        """Node ids of the hangs since the capability last finished a case."""
        streak: list[str] = []
        for event in self._history(what):
            streak = streak + [event["nodeid"]] if event["hang"] else []
        return streak

    def note(self, what: str, nodeid: str, hang: bool) -> None:
        with self.lock, open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"capability": what, "nodeid": nodeid, "hang": hang}) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    limit = config.getoption(options.STORM)
    if limit <= 0:
        return
    shared = getattr(config, "workerinput", {}).get(_SHARED)
    directory = Path(shared) if shared else Path(tempfile.mkdtemp(prefix="coc-session-"))
    config.stash[breaker_key] = StormBreaker(directory, limit)
    config.pluginmanager.register(_ControllerHooks(directory), "coc-storm-shared-dir")


class _ControllerHooks:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[_SHARED] = str(self.directory)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    breaker = item.config.stash.get(breaker_key, None)
    what = capability(item)
    if breaker is None or what is None:
        return (yield)
    hangs = breaker.recent_hangs(what)
    if len(hangs) >= breaker.limit:
        item.stash[stormed_key] = (
            f"not run: {len(hangs)} case(s) of {what} in a row hung or crashed (--coc-storm "
            f"{breaker.limit}); it fails without running, as the rest of {what} will: "
            + ", ".join(hangs[-breaker.limit:]))
    try:
        result = yield
    except HANGS as exc:
        if not isinstance(exc, StormBroken):
            breaker.note(what, item.nodeid, True)
        raise
    except pytest.skip.Exception:  # not judged: neither a hang nor a finished case
        raise
    except BaseException:
        _note_finished(breaker, what, item)
        raise
    _note_finished(breaker, what, item)
    return result


def refuse_if_stormed(item: pytest.Item) -> None:
    """Before a case's rank run: fail it, unrun, if its capability is in a storm."""
    why = item.stash.get(stormed_key, None)
    if why is not None:
        raise StormBroken(why)


def _note_finished(breaker: StormBreaker, what: str, item: pytest.Item) -> None:
    """A case that ended otherwise than in a hang; one stopped before its ranks ran proves nothing."""
    if stormed_key not in item.stash:
        breaker.note(what, item.nodeid, False)
