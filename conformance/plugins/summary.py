"""The compact JSON summary of a run: every case's outcome, checks by level, timings, perf figures.

Written with ``--coc-summary FILE`` (default: ``coc-summary.json`` inside the
``--alluredir`` directory, beside the results it summarises: two runs with
their own results folders never share one).  One line per case is appended to ``FILE`` + ``l``
(JSON lines) as each report arrives, so the results of finished cases survive
a crash of a worker or of the session; the final JSON adds the totals, the
skips by reason, and the count of cases collected against cases reported (and
against Allure result files), so a lost result is visible.  ``run_id`` is the
session's (:func:`conformance.roster.run_id`), which every Allure result of
the run carries too: the report refuses a verdict from another run.

A case whose implementation calls reached torch_npu's fused kernels (MC²)
carries ``fused_kernels`` (calls by kernel), and the run their totals; a case
on ranks carries its ``capability``, and ``fused_kernels_by_op`` says per
fused op how many of its cases reached a fused kernel, and the calls (on an
NPU node: whether that op ran on MC² at all).

Read by ``coc-gate``, ``coc-matrix`` and
``coc-expectations``; the format is :data:`SCHEMA`.  ``determinism`` records what the
run's determinism verdicts depended on (``HCCL_DETERMINISTIC`` and the like,
torch's deterministic switches).  A case's ``outcome`` is
``passed``, ``failed``, ``error``, ``skipped``, ``known``, ``not-gated`` or
``not judged`` (it passed, and no check it recorded passed); a case skipped
because the implementation does not offer what it needs carries a check
``not offered``.  ``expectations`` holds every entry of the expectations file
the run was judged against (``coc-gate`` reads which losses of judgment are
expected from it); ``digests`` (per case) and ``determinism_environment``
what ``coc-gate`` compares deterministic results across runs by.  The summary is written first when the session starts,
``complete: false``, and again, ``complete: true``, when it ends (false still
when it was interrupted): a run killed half way leaves a summary the gate and
the report refuse, never an earlier run's.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from conformance import options
from conformance.caseids import area, case_id
from conformance.options import impl_spec
from conformance.plugins.time_breakdown import fused_kernels_by_op, process_started
from conformance.record import report_properties
from conformance.record.report_properties import property_of
from conformance.record.verdicts import NOT_JUDGED, case_outcome, outcome_of
from conformance.roster import is_xdist_worker, roster, run_id

SCHEMA = 1
#: The summary's name inside the run's ``--alluredir`` when ``--coc-summary`` names none.
DEFAULT_NAME = "coc-summary.json"


def summary_path(config: pytest.Config) -> Path | None:
    given = config.getoption(options.SUMMARY)
    if given:
        return Path(given)
    allure_dir = config.getoption("allure_report_dir", None)
    return Path(allure_dir).resolve() / DEFAULT_NAME if allure_dir else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    """On the worker: what failed, as data (category and type) rather than as text."""
    report = yield
    if call.excinfo is not None and report.failed:
        from conformance.harness.case_errors import HANGS
        from conformance.record.failures import HANG, SUITE_ERROR, CheckFailure, SuiteError

        exc = call.excinfo.value
        failed = [c for c in property_of(report, report_properties.CHECKS) or () if outcome_of(c) == "failed"]
        category = (HANG if isinstance(exc, HANGS) else exc.category if isinstance(exc, CheckFailure)
                    else str(failed[0]["category"]) if property_of(report, report_properties.SUITE_ERROR_BESIDE)
                    else SUITE_ERROR if isinstance(exc, SuiteError) else "error")
        report.user_properties.append((report_properties.FAILURE, {
            "category": category, "type": type(exc).__name__, "message": str(exc)[:2000]}))
    return report


def not_judged(report: pytest.TestReport) -> bool:
    """Whether a case that passed judged nothing: it recorded checks, and none passed
    (:func:`~conformance.record.verdicts.case_outcome`)."""
    checks = property_of(report, report_properties.CHECKS) or []
    return case_outcome(outcome_of(c) for c in checks) == NOT_JUDGED


def record_of(report: pytest.TestReport) -> dict[str, Any]:
    """One case's line of the summary."""
    wasxfail = getattr(report, "wasxfail", None)
    if report.passed:
        outcome = NOT_JUDGED if not_judged(report) else "passed"
    elif report.failed:
        outcome = "failed" if report.when == "call" and not property_of(report, report_properties.SUITE_ERROR) \
            else "error"
    elif wasxfail is not None:
        outcome = "not-gated" if property_of(report, report_properties.NOT_GATED) else "known"
    else:
        outcome = "skipped"
    record: dict[str, Any] = {"id": case_id(report.nodeid), "nodeid": report.nodeid, "area": area(report.nodeid),
                              "outcome": outcome, "when": report.when, "duration": round(report.duration, 4)}
    if outcome == "skipped" and isinstance(report.longrepr, tuple):
        record["skip_reason"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    if wasxfail is not None:
        record["reason"] = wasxfail
    beside = property_of(report, report_properties.SUITE_ERROR_BESIDE)
    if beside is not None:
        record["suite_error"] = beside
    for key, name in (("checks", report_properties.CHECKS), ("timings", report_properties.TIMINGS),
                      ("fused_kernels", report_properties.FUSED_KERNELS),
                      ("capability", report_properties.CAPABILITY), ("clock", report_properties.CLOCK),
                      ("failure", report_properties.FAILURE), ("expectation", report_properties.EXPECTATION),
                      ("digests", report_properties.DIGESTS),
                      ("explore", report_properties.EXPLORE)):
        value = property_of(report, name)
        if value is not None:
            record[key] = value
    figures = property_of(report, report_properties.PERF_FIGURES)
    if figures is not None:
        record["perf"] = json.loads(figures) if isinstance(figures, str) else figures
    gate = property_of(report, report_properties.PERF_GATE)
    if gate is not None:
        record["perf_gate"] = gate
    return record


class SummaryWriter:
    """Collects every case's record (on the controller under xdist) and writes the summary."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.path = path
        self.lines = path.with_name(path.name + "l")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.lines.write_text("")
        self.records: dict[str, dict[str, Any]] = {}
        self.roster = roster(config)
        self.started = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # The call report decides; setup / teardown count only when they failed or skipped the case.
        if report.when != "call" and not (report.failed or report.skipped):
            return
        if report.when == "teardown" and report.nodeid in self.records and not report.failed:
            return
        record = record_of(report)
        self.records[report.nodeid] = record
        with open(self.lines, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The summary, provisional (``complete: false``), before any case runs: a run that never finishes leaves
        no earlier run's summary where its own belongs, and the gate and the report give it no verdict."""
        self._write(self._document(complete=False))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The summary of every case reported, complete unless the session was interrupted or broke down."""
        if is_xdist_worker(self.config):
            return
        stopped = exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
        self._write(self._document(complete=not stopped))

    def _document(self, *, complete: bool) -> dict[str, Any]:
        records = list(self.records.values())
        settings = _determinism_settings()
        environment = determinism_environment(self.config, settings) if any("digests" in r for r in records) else {}
        outcomes = Counter(r["outcome"] for r in records)
        skips = Counter(r.get("skip_reason", "?") for r in records if r["outcome"] == "skipped")
        levels: Counter[str] = Counter()
        fused: Counter[str] = Counter()
        for r in records:
            for check in r.get("checks", ()):
                levels[f"{check['level']}:{outcome_of(check)}"] += 1
            fused.update(r.get("fused_kernels", {}))
        missing = [n for n in self.roster.collected if n not in self.records]
        allure_dir = self.config.getoption("allure_report_dir", None)
        allure_results = (len(list(Path(allure_dir).glob("*-result.json")))
                          if allure_dir and Path(allure_dir).is_dir() else None)
        from conformance.plugins.known_outcomes import expectations_key, stale_key

        known = self.config.stash.get(expectations_key, None)
        stale, full = self.config.stash.get(stale_key, ([], False))
        return {
            "schema": SCHEMA,
            "run_id": run_id(self.config),
            "complete": complete,
            "implementation": impl_spec(self.config),
            "launcher": self.config.getoption(options.LAUNCHER),
            "gate": options.gate_spec(self.config),
            "expectations": [entry.as_dict() for entry in known.entries] if known is not None else [],
            "stale_expectations": stale,
            "full_run": full,
            "python": platform.python_version(),
            "torch": _version("torch"),
            "megatron_core": _version("megatron-core"),
            "implementation_notes": implementation_notes(self.config),
            "determinism": settings,
            "determinism_environment": environment,
            "process_started": process_started(),
            "started": self.started,
            "duration": round(time.time() - self.started, 2),
            "collected": len(self.roster.collected),
            "reported": len(records),
            "missing": missing,
            "crashed": self.roster.crashed,
            "allure_results": allure_results,
            "outcomes": dict(outcomes),
            "levels": dict(levels),
            "fused_kernels": dict(sorted(fused.items())),
            "fused_kernels_by_op": fused_kernels_by_op((r["capability"], r.get("fused_kernels", {}))
                                                       for r in records if "capability" in r),
            "skips_by_reason": dict(skips.most_common()),
            "cases": records,
        }

    def _write(self, doc: dict[str, Any]) -> None:
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.path)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if is_xdist_worker(self.config):
            return
        records = list(self.records.values())
        skips = Counter(r.get("skip_reason", "?") for r in records if r["outcome"] == "skipped")
        if skips:
            terminalreporter.section("coc-conformance: skips by reason")
            for reason, count in skips.most_common(15):
                terminalreporter.write_line(f"{count:>5}  {reason[:150]}")
        missing = [n for n in self.roster.collected if n not in self.records]
        if missing or self.roster.crashed:
            terminalreporter.write_line(f"coc-conformance: {len(missing)} collected case(s) have no result "
                                        f"(crashed workers: {self.roster.crashed})", red=True)
        notes = implementation_notes(self.config)
        if notes:
            terminalreporter.section("coc-conformance: notes from the implementation")
            for note in notes:
                terminalreporter.write_line(note, yellow=True)
        terminalreporter.write_line(f"coc-conformance: summary written to {self.path}")


def determinism_environment(config: pytest.Config, settings: dict[str, str | None]) -> dict[str, Any]:
    """What every deterministic result of the run depends on besides its case (``digests``): the implementation
    and its code, the ranks' device and backend, torch, and the determinism ``settings`` (``HCCL_DETERMINISTIC``
    and the like).  ``coc-gate`` compares two runs' digests only where these match."""
    from conformance.harness.impl_loader import code_digest
    from conformance.harness.launchers.devices import cpu, detect_device_kind, node_identity

    if config.getoption(options.LAUNCHER) == "threaded":
        kind = cpu(config.getoption(options.CPU_SLOTS))
    else:
        kind = detect_device_kind(config.getoption(options.CPU_SLOTS), config.getoption(options.BACKEND),
                                  config.getoption(options.RANKS_PER_DEVICE))
    return {"implementation": impl_spec(config), "implementation_code": code_digest(impl_spec(config)),
            **node_identity(kind), "torch": _version("torch"), "settings": settings}


def implementation_notes(config: pytest.Config) -> list[str]:
    """What the implementation says about this run (its optional ``notes``: e.g. a checkout its expectations
    were not written for); nothing when it cannot be loaded (the session stopped on that already)."""
    from conformance.harness.impl_loader import ImplementationLoadError, load_implementation

    try:
        impl = load_implementation(impl_spec(config))
    except ImplementationLoadError:
        return []
    return [str(note) for note in getattr(impl, "notes", ()) or ()]


def _determinism_settings() -> dict[str, str | None]:
    """What the run's determinism verdicts depended on (read after the implementation was loaded)."""
    from conformance.reporting.meta import determinism_settings

    return determinism_settings()


def _version(name: str) -> str:
    from conformance.reporting.meta import package_version

    return package_version(name)


def pytest_configure(config: pytest.Config) -> None:
    path = summary_path(config)
    if path is not None and not is_xdist_worker(config):
        config.pluginmanager.register(SummaryWriter(config, path), "coc-summary-writer")
