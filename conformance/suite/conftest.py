"""Fixtures shared by the suite's modules (beyond the plugin's)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from conformance.launching import prestart_ranks


def pytest_configure(config: pytest.Config) -> None:
    """The suite runs cases on ranks: their fork server starts now, while the suite is collected."""
    prestart_ranks(config)


@pytest.fixture(scope="session")
def impl_accepts_blocks(coc_impl: Any) -> Callable[[str], bool]:
    """Whether an op of the implementation takes an explicit tiling (``blocks=``)."""

    from conformance.harness.impl_loader import accepts_keyword

    return lambda op: accepts_keyword(getattr(coc_impl, op), "blocks")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    """Check the whole collection before anything deselects from it (``-k``, ``-m``, ``--coc-tp``, torchrun)."""
    _check_collection(config, items)
    return (yield)


def _check_collection(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the session when a case on ranks escapes the storm breaker, or a combination is uncovered."""
    from conformance.caseids import capability, in_suite, on_ranks
    from conformance.suite.coverage import holes

    unbroken = sorted({item.nodeid.split("[")[0] for item in items
                       if on_ranks(item) and capability(item) is None})
    if unbroken:
        raise pytest.UsageError("cases on ranks without a capability (the storm breaker could not stop a "
                                "storm of them; mark them coc_capability): " + ", ".join(unbroken))

    narrowed = any("::" in str(arg) for arg in config.args)
    if narrowed:
        return
    cases = [(getattr(item, "originalname", item.name), getattr(getattr(item, "callspec", None), "params", {}))
             for item in items if in_suite(item.path)]
    found = holes(cases)
    if found:
        lines = [f"{requirement}: {missing[:6]}{' ...' if len(missing) > 6 else ''}"
                 for requirement, missing in found.items()]
        raise pytest.UsageError("the suite's cases leave combinations of the catalogue uncovered:\n  "
                                + "\n  ".join(lines))
