"""One run of the suite as two runs are compared: its cases by case id, its gate and its expectations.

Read from its compact JSON summary (``coc-summary.json``, written by the
suite) or, failing that, an Allure results directory; a summary its run never
finished writing is refused (a verdict rests on a complete record).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.caseids import case_id
from conformance.harness.case_errors import HANGS, WorkerLost
from conformance.record.expected import Expectation
from conformance.record.failures import HANG, UNEXPECTED_PASS
from conformance.record.levels import Level


class RunError(ValueError):
    """A results directory or summary that cannot be read."""


@dataclass(frozen=True)
class Run:
    """One run's cases, by case id, and where they came from."""

    source: str
    implementation: str
    cases: Mapping[str, Mapping[str, Any]]
    gate: frozenset[str] = frozenset(level.value for level in Level)  #: the levels whose failures failed a case
    #: The expectations file the run was judged against (its entries that say which losses are expected).
    expectations: tuple[Expectation, ...] = ()
    gate_spec: str = ""  #: ``--coc-gate`` as the run's summary states it ("": unknown, e.g. Allure results)
    #: Entries of its expectations file that matched no case, or named no check its cases recorded.
    stale_expectations: tuple[str, ...] = ()
    full_run: bool = False  #: whether it ran every case of the suite (then a stale entry is red)
    #: What its deterministic results depend on besides their case (the implementation's code, device, torch).
    determinism_environment: Mapping[str, Any] = field(default_factory=dict)


def load_run(path: Path) -> Run:
    """A run from a ``coc-summary.json`` (or a directory holding one) or an Allure results directory."""
    candidates = [path] if path.is_file() else [path / "coc-summary.json", path.parent / "coc-summary.json"]
    for candidate in candidates:
        if candidate.is_file():
            try:
                doc = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise RunError(f"{candidate}: {exc}") from None
            _require_complete(candidate, doc)
            cases = {c["id"]: c for c in doc.get("cases", [])}
            for nodeid in doc.get("missing", []):  # collected, never reported: its worker was lost
                cases.setdefault(case_id(nodeid), {"id": case_id(nodeid), "outcome": "error", "failure": {
                    "category": HANG, "type": WorkerLost.__name__, "message": f"{WorkerLost.__name__}: no result "
                    "(the worker running it died, or the run ended before it ran)"}})
            try:
                gated = frozenset(level.value for level in Level.parse_many(str(doc.get("gate") or "all")))
                expected = tuple(Expectation(**entry) for entry in doc.get("expectations", ()))
            except (TypeError, ValueError) as exc:
                raise RunError(f"{candidate}: gate or expectations: {exc}") from None
            return Run(str(candidate), doc.get("implementation", "?"), cases, gated, expected,
                       str(doc.get("gate") or ""), tuple(map(str, doc.get("stale_expectations", ()))),
                       bool(doc.get("full_run")), dict(doc.get("determinism_environment") or {}))
    if path.is_dir() and any(path.glob("*-result.json")):
        return _allure_run(path)
    raise RunError(f"{path}: neither a coc-summary.json nor an Allure results directory")


def _require_complete(path: Path, doc: Mapping[str, Any]) -> None:
    """Refuse a summary its run never finished writing (``complete: false``: killed, interrupted or still running),
    or one beside Allure results of another run: a verdict rests on a complete record of one run."""
    run = str(doc.get("run_id") or "?")
    if doc.get("complete") is False:
        raise RunError(f"{path}: the summary of run {run} is incomplete (the run was killed, interrupted or is still "
                       "running): no verdict rests on it")
    from conformance.record.report_properties import RUN_LABEL

    others: set[str] = set()
    for result in path.parent.glob("*-result.json"):
        try:
            labels = json.loads(result.read_text()).get("labels", ())
        except (OSError, json.JSONDecodeError):
            continue
        others.update(str(label.get("value")) for label in labels if label.get("name") == RUN_LABEL)
    others.discard(run)
    if doc.get("run_id") and others:
        raise RunError(f"{path}: the summary is of run {run}, the Allure results beside it of run(s) "
                       f"{', '.join(sorted(others))}: not one run")


def _allure_run(path: Path) -> Run:
    """Cases from Allure result files (status and message only; no levels, no perf figures), each named by the
    case id it carries (label ``coc_case``, as a summary names it), else by its full name and parameters."""
    from conformance.record.report_properties import CASE_LABEL

    status = {"passed": "passed", "failed": "failed", "broken": "failed", "skipped": "skipped"}
    cases: dict[str, dict[str, Any]] = {}
    for result in path.glob("*-result.json"):
        doc = json.loads(result.read_text())
        labelled = [str(label.get("value")) for label in doc.get("labels", ()) if label.get("name") == CASE_LABEL]
        params = ", ".join(f"{p['name']}={p['value']}" for p in doc.get("parameters", []))
        case = labelled[0] if labelled else f"{doc.get('fullName', doc.get('name', result.stem))}[{params}]"
        details = doc.get("statusDetails", {}) or {}
        outcome = status.get(doc.get("status", ""), "failed")
        message = str(details.get("message", ""))
        if outcome == "skipped" and message.startswith("XFAIL"):
            outcome = "known"
        if outcome == "failed" and message.startswith(UNEXPECTED_PASS):
            category = UNEXPECTED_PASS
        elif outcome == "failed" and any(hang.__name__ in message for hang in HANGS):
            category = HANG
        else:
            category = "error"
        record = {"id": case, "outcome": outcome, "failure": {"message": message, "category": category}}
        if outcome == "skipped":
            record["skip_reason"] = message
        cases[case] = record
    return Run(str(path), "?", cases)
