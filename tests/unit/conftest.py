"""Fixtures of the unit tests that run tasks on ranks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.harness.launchers.threaded import ThreadedLauncher


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessLauncher]:
    """Warm gloo rank pools, for one test module."""
    launcher = ProcessLauncher(cpu(8), max_live_ranks=8)
    yield launcher
    launcher.close()


@pytest.fixture(params=["process", "threaded"])
def launcher(request: pytest.FixtureRequest, pool: ProcessLauncher) -> ProcessLauncher | ThreadedLauncher:
    """Each launcher that runs ranks on this machine: the process pool, and threads."""
    return pool if request.param == "process" else ThreadedLauncher()
