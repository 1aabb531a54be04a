"""Fixtures every kind of test may use: warm gloo pools."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.dist_helpers import GlooPool

#: pytester drives the suite runs (declared here: only a top-level conftest may name plugins).
pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def pools() -> Iterator[Callable[[int], GlooPool]]:
    """``pools(tp)``: a warm gloo pool of ``tp`` ranks, kept for the module's tests."""
    from tests.support.dist_helpers import GlooPool  # torch: only for the tests that ask

    made: dict[int, GlooPool] = {}

    def get(tp: int) -> GlooPool:
        if tp not in made or made[tp].closed:
            made[tp] = GlooPool(tp)
        return made[tp]

    yield get
    for pool in made.values():
        pool.close()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """torch is imported before a test that runs pytest in this process (``pytester``): an in-process run restores
    ``sys.modules`` when it ends, so a torch first imported inside one (the summary's settings, a case) would be
    imported again by the next, which torch's C extension does not survive ("bad call flags", a segfault)."""
    if "pytester" in getattr(item, "fixturenames", ()):
        import torch  # noqa: F401
