"""Running the conformance suite against a given implementation, in a subprocess, on the test session's ranks."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence

import pytest

from conformance.options import RANK_SERVER
from conformance.plugin import default_max_live_ranks, rank_server_address
from tests.support import ROOT
from tests.support.pytest_forks import PytestForks
from tests.support.suite_run import SuiteRun


@pytest.fixture(scope="session")
def shared_ranks(pytestconfig: pytest.Config) -> Iterator[str]:
    """The rank server every suite run of this test session runs its cases on (``--coc-rank-server``): the one
    the xdist controller started for its workers, else one started here.  Each run still has pools of its own,
    forked from the server's one warm fork server (``docs/DESIGN.md#rank-server``)."""
    from conformance.harness.launchers.devices import cpu
    from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher

    address = rank_server_address(pytestconfig)
    server = None if address else RankServer(cpu(), max_live_ranks=default_max_live_ranks(8))
    address = address or server.address  # type: ignore[union-attr]
    client = ServerLauncher(address)
    client.prestart()  # its fork server imports torch now, once for every run
    client.close()
    yield address
    if server is not None:
        server.close()


@pytest.fixture(scope="session")
def session_forks() -> Iterator[PytestForks]:
    """This test process's fork server of pytest sessions (torch and pytest imported once for every run)."""
    forks = PytestForks()
    yield forks
    forks.close()


@pytest.fixture
def run_pytest(pytester: pytest.Pytester, shared_ranks: str,
               session_forks: PytestForks) -> Callable[..., pytest.RunResult]:
    """``pytester.runpytest_subprocess`` with the suite's plugin, in a fresh process forked from
    :class:`~tests.support.pytest_forks.PytestForks`, its cases on the session's shared rank server.

    Without Hypothesis's plugin: the suite uses no Hypothesis, and the plugin imports all of it for its terminal
    summary (0.3 s of CPU a run)."""

    def run(*args: str, timeout: float = 600) -> pytest.RunResult:
        return session_forks.runpytest(pytester, "-p", "conformance.plugin", "-p", "no:hypothesispytest",
                                       RANK_SERVER, shared_ranks, *args, timeout=timeout)

    return run


@pytest.fixture
def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
              run_pytest: Callable[..., pytest.RunResult]) -> Callable[..., SuiteRun]:
    """Run ``conformance.suite.<module>`` (the whole suite for "", or only its ``cases``, by case id) against
    ``impl`` (``module:attr``), as :func:`run_pytest` does."""

    def run(module: str, impl: str, *args: str, cases: Sequence[str] = (), timeout: float = 600) -> SuiteRun:
        pytester.chdir()
        env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", env_path)
        package = f"conformance.suite.{module}" if module else "conformance.suite"
        targets = [f"{package}::{case.split('::', 1)[1]}" for case in cases] or [package]
        result = run_pytest(
            "-p", "no:cacheprovider", "-q", "-rf", "--pyargs", *targets,
            "--coc-impl", impl, "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), *args, timeout=timeout,
        )
        output = result.stdout.str()
        failed = set(re.findall(r"^FAILED (\S+)", output, re.MULTILINE))
        try:
            outcomes = result.parseoutcomes()
        except ValueError:  # no summary line: the session did not get that far
            outcomes = {}
        return SuiteRun(failed, outcomes.get("passed", 0), output, outcomes, int(result.ret))

    return run
