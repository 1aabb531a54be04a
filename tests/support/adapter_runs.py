"""One run of the conformance suite against an adapter, with its expectations file, read back from its summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.record.verdicts import FAILED, outcome_of
from tests.support.suite_run import SuiteRun

#: The ops at TP 2: each op's float32 golden and exact-layout cases and its uneven token counts (under a minute on 2
#: cores; chosen here, not by the smoke tier, whose cases follow what catches the proof table's faults).
OPS_TP2 = ("--coc-tp", "2", "-k", "(matches_golden or exact_layout) and float32 or uneven_token_counts")


def adapter_run(run_suite: Callable[..., SuiteRun], tmp_path: Path, module: str, impl: str, *args: str,
                expectations: Path | None = None) -> tuple[SuiteRun, dict[str, Any]]:
    """``conformance.suite.<module>`` against ``impl`` (with ``expectations`` when given): the run and its summary."""
    summary = tmp_path / f"{module}-summary.json"
    known = ("--coc-expectations", str(expectations)) if expectations is not None else ()
    run = run_suite(module, impl, *known, "--coc-summary", str(summary), *args, timeout=600)
    assert summary.exists(), run.output[-6000:]
    return run, json.loads(summary.read_text())


def failed_checks(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks of a case (as the summary carries it) that failed."""
    return [c for c in case.get("checks", ()) if outcome_of(c) == FAILED]


def assert_green(run: SuiteRun, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The run passed with its expectations: nothing failed, crashed or went missing; its known cases returned."""
    assert run.ret == 0 and not run.failed, f"unexpected failures: {sorted(run.failed)}\n{run.output[-6000:]}"
    assert not summary.get("missing") and not summary.get("crashed"), (summary.get("missing"), summary.get("crashed"))
    bad = [c["id"] for c in summary["cases"] if c["outcome"] in ("failed", "error", "not-gated")]
    assert not bad, f"cases that failed: {bad}"
    return [c for c in summary["cases"] if c["outcome"] == "known"]
