"""The conformance suite fails broken implementations (and passes the reference)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import SuiteRun

FAULTS = "tests.faulty_impls"

#: (fault, -k selection of the checks expected to catch it)
CONFIG_FAULTS = [
    ("EnvBeatsCommandLine", "effective_config and cli-over-env"),
    ("SilentOverrides", "effective_config and (cli-over-env or fused-over-num or without-enable)"),
    ("UntypedErrors", "typed_error_names_flags and mc2"),
    ("AcceptsAnyChunkCount", "typed_error_names_flags and chunks"),
    ("ChecksOnRankZeroOnly", "every_rank and mc2"),
    ("AgreesBeforeValidating", "every_rank and mc2"),
]


@pytest.mark.parametrize("fault, select", CONFIG_FAULTS, ids=[f[0] for f in CONFIG_FAULTS])
def test_config_checks_catch(run_suite: Callable[..., SuiteRun], fault: str, select: str) -> None:
    run = run_suite("test_config", f"{FAULTS}:{fault}", "-k", select, "--coc-tp", "2",
                    "--coc-case-timeout", "10")
    assert run.failed, f"{fault} was not caught:\n{run.output[-3000:]}"
    assert not run.passed, f"{fault} passed some of the checks meant to catch it:\n{run.output[-3000:]}"
