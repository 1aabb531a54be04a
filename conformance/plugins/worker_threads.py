"""A pytest-xdist worker's share of the cores for its own compute (the CPU truth, the checks).

torch and numpy start a thread per core in every process: ``-n N`` workers on C cores ran N x C threads
for their truths and checks, beside the ranks on the same cores.  A worker takes C // N threads (at least
one), set before torch or numpy is imported (collection imports neither); ``OMP_NUM_THREADS`` set by the
user is theirs, and left alone.  The ranks set their own (one each).
"""

from __future__ import annotations

import os
import sys

import pytest

from conformance import options
from conformance.roster import is_xdist_worker

#: The variable torch, MKL and OpenBLAS size their thread pools by.
THREADS_VARIABLE = "OMP_NUM_THREADS"


def worker_threads(cores: int, workers: int) -> int:
    """A worker's threads when ``workers`` share ``cores``."""
    return max(1, cores // max(1, workers))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not is_xdist_worker(config) or THREADS_VARIABLE in os.environ:
        return
    threads = worker_threads(options.available_cores(), int(config.workerinput.get("workercount", 1)))  # type: ignore[attr-defined]
    os.environ[THREADS_VARIABLE] = str(threads)
    if "torch" in sys.modules:  # imported already (a conftest's import): its pool is sized, so size it again
        sys.modules["torch"].set_num_threads(threads)
