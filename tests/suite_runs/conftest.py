"""Running the conformance suite against a given implementation, in a subprocess."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest

from tests.support import ROOT
from tests.support.suite_run import SuiteRun


@pytest.fixture
def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Callable[..., SuiteRun]:
    """Run ``conformance.suite.<module>`` (the whole suite for "") against ``impl`` (``module:attr``), in a
    subprocess."""

    def run(module: str, impl: str, *args: str, timeout: float = 600) -> SuiteRun:
        pytester.chdir()
        env_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        monkeypatch.setenv("PYTHONPATH", env_path)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-p", "conformance.plugin", "-q", "-rf",
            "--pyargs", f"conformance.suite.{module}" if module else "conformance.suite",
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
