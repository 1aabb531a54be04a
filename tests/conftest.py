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
