"""Running the conformance suite against a given implementation, in a subprocess, on the test session's ranks."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest

from conformance.launching import default_max_live_ranks, rank_server_address
from conformance.options import RANK_SERVER
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


@dataclass(frozen=True)
class EmulatedNode:
    """An emulated 8-NPU node of this test process (npu-sim): its card locks and device leases in folders of their
    own (another test process's runs, or a user's, are another node), and one rank server for its runs."""

    environ: dict[str, str]
    lease_dir: str
    rank_server: str


@pytest.fixture(scope="session")
def emulated_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedNode]:
    """The node the runs given ``--coc-emulate-npu`` run on (:func:`run_suite_on_npus`)."""
    from conformance.harness.launchers.devices import detect_device_kind
    from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher

    home = tmp_path_factory.mktemp("npu-node")
    environ = {"NPU_SIM_NODE_DIR": str(home / "cards")}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**environ, "NPU_SIM": "1"}.items():
            patch.setenv(name, value)
        for name in ("ASCEND_RT_VISIBLE_DEVICES", "HCCL_DETERMINISTIC", "NPU_SIM_CARDS", "NPU_SIM_SOC"):
            patch.delenv(name, raising=False)
        kind = detect_device_kind()
        assert kind.name == "npu", kind
        server = RankServer(kind, max_live_ranks=default_max_live_ranks(kind.count))
    client = ServerLauncher(server.address)
    client.prestart()
    client.close()
    yield EmulatedNode(environ, str(home / "leases"), server.address)
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

    def run(*args: str, timeout: float = 600, rank_server: str | None = None) -> pytest.RunResult:
        return session_forks.runpytest(pytester, "-p", "conformance.plugin", "-p", "no:hypothesispytest",
                                       RANK_SERVER, rank_server or shared_ranks, *args, timeout=timeout)

    return run


@pytest.fixture
def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
              run_pytest: Callable[..., pytest.RunResult]) -> Callable[..., SuiteRun]:
    """Run ``conformance.suite.<module>`` (the whole suite for "", or only its ``cases``, by case id) against
    ``impl`` (``module:attr``), as :func:`run_pytest` does."""

    def run(module: str, impl: str, *args: str, cases: Sequence[str] = (), timeout: float = 600,
            rank_server: str | None = None) -> SuiteRun:
        pytester.chdir()
        env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", env_path)
        package = f"conformance.suite.{module}" if module else "conformance.suite"
        targets = [f"{package}::{case.split('::', 1)[1]}" for case in cases] or [package]
        result = run_pytest(
            "-p", "no:cacheprovider", "-q", "-rf", "--pyargs", *targets,
            "--coc-impl", impl, "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), *args, timeout=timeout,
            rank_server=rank_server,
        )
        output = result.stdout.str()
        failed = set(re.findall(r"^FAILED (\S+)", output, re.MULTILINE))
        try:
            outcomes = result.parseoutcomes()
        except ValueError:  # no summary line: the session did not get that far
            outcomes = {}
        return SuiteRun(failed, outcomes.get("passed", 0), output, outcomes, int(result.ret))

    return run


@pytest.fixture
def run_suite_on_npus(run_suite: Callable[..., SuiteRun], emulated_node: EmulatedNode,
                      monkeypatch: pytest.MonkeyPatch) -> Callable[..., SuiteRun]:
    """:func:`run_suite` on the emulated 8-NPU node (``--coc-emulate-npu``: hccl, one rank per card, torch_npu's MC2
    kernels), its cases on the node's rank server; ``environ`` adds variables the session and its ranks see."""

    def run(module: str, impl: str, *args: str, environ: dict[str, str] | None = None,
            timeout: float = 600) -> SuiteRun:
        for name in ("NPU_SIM", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_DETERMINISTIC", "NPU_SIM_CARDS", "NPU_SIM_SOC"):
            monkeypatch.delenv(name, raising=False)
        for name, value in {**emulated_node.environ, **(environ or {})}.items():
            monkeypatch.setenv(name, value)
        return run_suite(module, impl, "--coc-emulate-npu", "--coc-lease-dir", emulated_node.lease_dir, *args,
                         timeout=timeout, rank_server=emulated_node.rank_server)

    return run

