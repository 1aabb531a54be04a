"""Fixtures of the unit tests that run tasks on ranks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher
from conformance.harness.launchers.threaded import ThreadedLauncher


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessLauncher]:
    """Warm gloo rank pools, for one test module."""
    launcher = ProcessLauncher(cpu(8), max_live_ranks=8)
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def rank_server() -> Iterator[RankServer]:
    """A session's rank server (as the xdist controller starts it), for one test module."""
    server = RankServer(cpu(8), max_live_ranks=8)
    yield server
    server.close()


@pytest.fixture(scope="module")
def served(rank_server: RankServer) -> Iterator[ServerLauncher]:
    """A worker's launcher on the module's rank server."""
    launcher = ServerLauncher(rank_server.address, binds_devices=False)
    yield launcher
    launcher.close()


@pytest.fixture(params=["process", "served"])
def pool_launcher(request: pytest.FixtureRequest) -> ProcessLauncher | ServerLauncher:
    """Warm rank pools, in this process or on a rank server."""
    return request.getfixturevalue("pool" if request.param == "process" else "served")


@pytest.fixture(params=["process", "served", "threaded"])
def launcher(request: pytest.FixtureRequest) -> ProcessLauncher | ServerLauncher | ThreadedLauncher:
    """Each launcher that runs ranks on this machine: the process pools, here or on a rank server, and threads."""
    if request.param == "threaded":
        return ThreadedLauncher()
    return request.getfixturevalue("pool" if request.param == "process" else "served")
