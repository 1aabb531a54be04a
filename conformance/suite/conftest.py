"""Fixtures shared by the suite's modules (beyond the plugin's)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="session")
def impl_accepts_blocks(coc_impl: Any) -> Callable[[str], bool]:
    """Whether an op of the implementation takes an explicit tiling (``blocks=``)."""

    def accepts(op: str) -> bool:
        params = inspect.signature(getattr(coc_impl, op)).parameters
        return "blocks" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    return accepts
