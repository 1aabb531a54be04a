"""Fixtures for the unit tests: running the conformance suite against a given implementation, warm gloo pools."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.dist_helpers import GlooPool

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class SuiteRun:
    """Outcome of one conformance-suite run in a subprocess."""

    failed: set[str]
    passed: int
    output: str
    outcomes: dict[str, int]
    ret: int


@pytest.fixture
def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Callable[..., SuiteRun]:
    """Run ``conformance.suite.<module>`` against ``impl`` (``module:attr``) in a subprocess."""

    def run(module: str, impl: str, *args: str, timeout: float = 600) -> SuiteRun:
        pytester.chdir()
        env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", env_path)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "conformance.plugin", "-q", "-rf",
            "--pyargs", f"conformance.suite.{module}",
            "--coc-impl", impl, "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            *args, timeout=timeout,
        )
        output = result.stdout.str()
        failed = set(re.findall(r"^FAILED (\S+)", output, re.MULTILINE))
        try:
            outcomes = result.parseoutcomes()
        except ValueError:  # no summary line: the session did not get that far
            outcomes = {}
        return SuiteRun(failed, outcomes.get("passed", 0), output, outcomes, int(result.ret))

    return run


@pytest.fixture(scope="module")
def pools() -> Iterator[Callable[[int], GlooPool]]:
    """``pools(tp)``: a warm gloo pool of ``tp`` ranks, kept for the module's tests."""
    from tests.dist_helpers import GlooPool  # torch: only for the tests that ask

    made: dict[int, GlooPool] = {}

    def get(tp: int) -> GlooPool:
        if tp not in made or made[tp].closed:
            made[tp] = GlooPool(tp)
        return made[tp]

    yield get
    for pool in made.values():
        pool.close()
