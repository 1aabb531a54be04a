"""Where a case's time goes: lease wait, pool start, the implementation, the references, the checks.

Each test gets a fresh :class:`~conformance.harness.runner.CaseTimings` in
its stash before its fixtures run; the ``coc_ranks`` fixture records every
rank run into it; this plugin stores it in the report's
``user_properties`` (``coc_timings``, read by the JSON summary and the Allure
hooks) and prints the totals, the slot utilisation (ranks x time on them over
slots x wall) and the ten slowest cases at the end (on the controller under
xdist).

Every case, on ranks or not, also carries its clock (``coc_clock``): its
worker, when that worker's process and the case began, the worker's CPU
time before the case (``process_cpu``) and for it (``cpu``).  From consecutive cases of a worker the schedule
simulation (``conformance.bench.schedule``) learns each case's whole time on
its worker (set-up, teardown and what lies between cases included) and the
workers' start-up (interpreter, imports, collection).

The same record counts which of torch_npu's fused kernels (MC²) the
implementation's calls reached (``coc_fused_kernels``, apart from the
timings), and the case's capability (``coc_capability``); the totals close
the terminal summary's first line, and per fused op (:func:`fused_kernels_by_op`,
which the JSON summary uses too) they say on an NPU node whether each op's
calls reached a fused kernel at all.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Generator, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from conformance.caseids import capability, needs
from conformance.harness.runner import CaseTimings
from conformance.protocol import FUSED_OPS
from conformance.record import report_properties

timings_key = pytest.StashKey[CaseTimings]()
#: When the case began (epoch seconds) and this process's CPU time then.
_begun_key = pytest.StashKey["tuple[float, float]"]()
#: Columns of the breakdown, in print order.
COLUMNS = ("lease_wait", "pool_start", "impl", "reference", "ranks", "checks", "total")


@functools.cache
def process_started() -> float | None:
    """When this process began (epoch seconds; None where ``/proc`` does not say)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError, StopIteration, AttributeError):
        return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A fresh record, before the case's fixtures (``coc_ranks`` records into it), with what the case needs."""
    item.stash[_begun_key] = (time.time(), time.process_time())
    need = needs(item)
    item.stash[timings_key] = CaseTimings(world=need.world, exclusive=need.exclusive)


def case_timings(item: pytest.Item) -> CaseTimings:
    """The running case's record (one made on the spot outside a pytest run's setup)."""
    return item.stash.setdefault(timings_key, CaseTimings())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    record = case_timings(item)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        record.total = time.perf_counter() - start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    report = yield
    record = item.stash.get(timings_key, None)
    if call.when == "call" and record is not None and record.runs:
        report.user_properties.append((report_properties.TIMINGS, record.as_dict()))
        report.user_properties.append((report_properties.CAPABILITY, capability(item)))
        if record.fused_kernels:
            report.user_properties.append((report_properties.FUSED_KERNELS, dict(record.fused_kernels)))
    begun = item.stash.get(_begun_key, None)
    if begun is not None and (call.when == "call" or (call.when == "setup" and not report.passed)):
        report.user_properties.append((report_properties.CLOCK, {
            "worker": getattr(item.config, "workerinput", {}).get("workerid", "main"),
            "process_started": process_started(), "start": round(begun[0], 4), "process_cpu": round(begun[1], 4),
            "cpu": round(time.process_time() - begun[1], 4)}))
    return report


def fused_kernels_by_op(cases: Iterable[tuple[str | None, Mapping[str, int]]]) -> dict[str, dict[str, Any]]:
    """Per fused op whose cases ran on ranks (``cases``: each case's capability and its fused kernel calls): its
    ``cases``, the cases whose calls ``reached`` a fused kernel, and the ``calls`` by kernel (none: on an NPU node,
    that op never ran on MC²).  The JSON summary and the terminal say it with this one function."""
    by_op: dict[str, dict[str, Any]] = {}
    for kind, fused in cases:
        op = (kind or "").removeprefix("op:").split("/", 1)[0]
        if not (kind or "").startswith("op:") or op not in FUSED_OPS:
            continue
        entry = by_op.setdefault(op, {"cases": 0, "reached": 0, "calls": Counter()})
        entry["cases"] += 1
        entry["reached"] += bool(fused)
        entry["calls"].update(fused)
    return {op: {**entry, "calls": dict(sorted(entry["calls"].items()))} for op, entry in sorted(by_op.items())}


def describe_fused_by_op(by_op: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: per fused op, the calls of each kernel its cases reached, in how many of them (or none)."""
    return "; ".join(
        f"{op} " + (", ".join(f"{kernel} {n}" for kernel, n in e["calls"].items()) + f" in {e['reached']} of "
                    f"{e['cases']} case(s)" if e["calls"] else f"none in {e['cases']} case(s)")
        for op, e in by_op.items())


def timings_of(report: pytest.TestReport) -> dict[str, Any] | None:
    found = report_properties.property_of(report, report_properties.TIMINGS)
    return None if found is None else dict(cast(dict[str, Any], found))


def slot_seconds(timings: dict[str, Any]) -> float:
    """What a case used of the node: its ranks times its time on them, pool start left out (one-time)."""
    return float(timings.get("world", 0)) * max(0.0, timings.get("ranks", 0.0) - timings.get("pool_start", 0.0))


class TimeTally:
    """Totals, slot utilisation and the slowest cases, printed in the terminal summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.cases: list[tuple[str, dict[str, Any]]] = []
        self.started = time.monotonic()
        #: torch_npu's fused kernel calls of every case (:data:`~conformance.record.report_properties.FUSED_KERNELS`).
        self.fused: Counter[str] = Counter()
        self.fused_cases = 0
        #: Every case on ranks: its capability and its fused kernel calls (:func:`fused_kernels_by_op`).
        self.capabilities: list[tuple[str | None, dict[str, int]]] = []

    def pytest_sessionstart(self) -> None:
        self.started = time.monotonic()

    def _kind(self) -> Any:
        from conformance import options
        from conformance.harness.launchers.devices import detect_device_kind

        try:
            return detect_device_kind(self.config.getoption(options.CPU_SLOTS), self.config.getoption(options.BACKEND),
                                      self.config.getoption(options.RANKS_PER_DEVICE))
        except Exception:  # noqa: BLE001 - a configuration refused elsewhere, with its reason
            return None

    def slots(self) -> int:
        """The devices (CPU slots) the workers of this run share."""
        kind = self._kind()
        return len(kind.lease_names()) if kind is not None else 0

    def node(self) -> str:
        """The device kind the ranks of this run ran on ("" where it cannot be said)."""
        kind = self._kind()
        return kind.name if kind is not None else ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        found = timings_of(report)
        fused = report_properties.property_of(report, report_properties.FUSED_KERNELS)
        if found is not None:
            self.cases.append((report.nodeid, found))
            self.capabilities.append((report_properties.property_of(report, report_properties.CAPABILITY),
                                      dict(fused or {})))
        if fused:
            self.fused.update(fused)
            self.fused_cases += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.cases:
            return
        totals = {c: sum(t.get(c, 0.0) for _, t in self.cases) for c in COLUMNS}
        pools = sum(t.get("pools_started", 0) for _, t in self.cases)
        worst_wait = max(t.get("longest_lease_wait", t.get("lease_wait", 0.0)) for _, t in self.cases)
        terminalreporter.section("coc-conformance: where the time went")
        terminalreporter.write_line(
            f"{len(self.cases)} distributed cases: " + ", ".join(f"{c} {totals[c]:.1f} s" for c in COLUMNS)
            + f"; {pools} run(s) waited for ranks to start; longest single lease wait {worst_wait:.2f} s")
        if self.fused:
            terminalreporter.write_line(
                f"fused kernels the implementation reached, in {self.fused_cases} case(s): "
                + ", ".join(f"{kernel} {n}" for kernel, n in sorted(self.fused.items())))
        by_op = fused_kernels_by_op(self.capabilities)
        if by_op and (self.fused or self.node() == "npu"):  # elsewhere no fused kernel is there to reach
            terminalreporter.write_line(f"fused kernels by op: {describe_fused_by_op(by_op)}")
        slots, wall = self.slots(), time.monotonic() - self.started
        if slots and wall > 0:
            used = sum(slot_seconds(t) for _, t in self.cases)
            terminalreporter.write_line(
                f"slot utilisation {used / (slots * wall):.0%}: ranks x time {used:.1f} s over {slots} slot(s) "
                f"x {wall:.1f} s wall")
        header = " ".join(f"{c:>10}" for c in COLUMNS)
        terminalreporter.write_line(f"{header}  slowest cases")
        for nodeid, t in sorted(self.cases, key=lambda c: -c[1].get("total", 0.0))[:10]:
            row = " ".join(f"{t.get(c, 0.0):>10.2f}" for c in COLUMNS)
            terminalreporter.write_line(f"{row}  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimeTally(config), "coc-time-tally")
