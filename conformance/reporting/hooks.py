"""pytest hooks that describe every case to Allure; the plugin registers them with ``--alluredir``.

* setup: epic, the implementation and every parametrize value as readable
  parameters (before allure-pytest adds raw ones; ``device`` out of history);
* teardown: default feature, story, severity and title for what the test did
  not describe through :func:`conformance.reporting.allure.describe_case`;
* a failing :class:`~conformance.harness.case_errors.CaseError`: every rank's evidence;
* after the call: what the checks recorded (:mod:`conformance.judge.evidence`):
  comparisons, texts, timelines and the case's own description;
* after the call: each check's requirement level as a tag (and the level of the
  worst failed check as label ``requirement``), and where the case's time went;
* session end: ``categories.json`` and ``environment.properties``.  Under
  xdist only the controller writes them, after every worker has reported
  what it ran on (``workeroutput``); allure-pytest's per-test files carry
  unique names, so workers never clobber each other.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from conformance import options, report_properties
from conformance.harness.case_errors import CaseError
from conformance.judge import evidence
from conformance.reporting import allure as reporting
from conformance.reporting import meta as report_meta
from conformance.reporting.allure import readable
from conformance.roster import is_xdist_worker, roster

_OUTPUT_KEY = "coc_allure"


def _params(item: pytest.Item) -> dict[str, Any]:
    return dict(getattr(getattr(item, "callspec", None), "params", {}))


def _story(params: dict[str, Any], check: str) -> str:
    if "mode" in params:
        return readable(params["mode"])
    if isinstance(params.get("sp"), bool):
        return "SP" if params["sp"] else "no SP"
    return check


def _defaults(item: pytest.Item) -> dict[str, str]:
    """Feature (op or layer, else the module), story (mode or SP, else the check) and title."""
    params = _params(item)
    module = getattr(getattr(item, "module", None), "__name__", item.path.stem).rsplit(".", 1)[-1]
    check = getattr(item, "originalname", item.name).removeprefix("test_").replace("_", " ")
    feature = next((readable(params[k]) for k in ("op", "layer") if k in params),
                   module.removeprefix("test_").replace("_", " "))
    values = ", ".join(readable(v) for v in params.values())
    return {"feature": feature, "story": _story(params, check),
            "title": check.capitalize() + (f" [{values}]" if values else "")}


class AllureHooks:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.world_sizes: set[int] = set()
        self.devices: set[str] = set()
        self.backends: set[str] = set()
        self.reported: set[str] = set()  # on the controller (or without xdist)

    def pytest_configure(self, config: pytest.Config) -> None:
        reporting.activate(True, figures=config.getoption(options.FIGURES))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        reporting.activate(False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        params = _params(item)
        self.world_sizes.update(params[p] for p in options.TP_PARAMS if isinstance(params.get(p), int))
        reporting.begin_case({**params, "implementation": options.impl_spec(item.config)})
        evidence.begin()

    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        reporting.finish_case(item, **_defaults(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
            None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, CaseError):
            reporting.attach_evidence(call.excinfo.value)
        if call.when == "call":
            found = evidence.end()
            if found is not None:
                reporting.attach_case_evidence(found)
            reporting.label_levels(report_properties.property_of(report, report_properties.CHECKS) or [])
            reporting.attach_timings(report_properties.property_of(report, report_properties.TIMINGS))
            reporting.attach_exploration(report_properties.property_of(report, report_properties.EXPLORE))
        return report

    def _observe_device(self) -> None:
        """The device family and backend, where this process already has torch loaded."""
        if "torch" not in sys.modules:
            return  # no case needed torch: do not pay its import for a label
        from conformance.harness.launchers.devices import detect_device_kind

        config = self.config
        kind = detect_device_kind(config.getoption(options.CPU_SLOTS), config.getoption(options.BACKEND))
        self.devices.add(kind.name)
        launcher = config.getoption(options.LAUNCHER)
        self.backends.add("threaded (in-process)" if launcher == "threaded" else kind.backend)

    def _observed(self) -> dict[str, list[Any]]:
        return {"world_sizes": sorted(self.world_sizes), "devices": sorted(self.devices),
                "backends": sorted(self.backends)}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not is_xdist_worker(self.config):
            self.reported.add(report.nodeid)

    def _report_lost_cases(self) -> None:
        """Crashed and never-run cases get a broken result each (the workers wrote none).

        Cases left unrun by ``-x`` or an interrupt, with no worker lost, stay absent.
        """
        results = self.config.option.allure_report_dir
        lost = roster(self.config)
        for nodeid in lost.crashed:
            reporting.report_lost_case(results, nodeid, "the pytest worker running this case died "
                                                        "(see the run's output for its last words)")
        for nodeid in lost.collected if lost.crashed else ():
            if nodeid not in self.reported and nodeid not in lost.crashed:
                reporting.report_lost_case(results, nodeid, "never run: the run lost its workers before "
                                                            "reaching this case")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        seen = getattr(node, "workeroutput", {}).get(_OUTPUT_KEY, {})
        self.world_sizes.update(seen.get("world_sizes", ()))
        self.devices.update(seen.get("devices", ()))
        self.backends.update(seen.get("backends", ()))

    @pytest.hookimpl(tryfirst=True)  # lost cases are written before the summary counts results
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = self.config
        if is_xdist_worker(config):  # an xdist worker: report to the controller
            self._observe_device()
            config.workeroutput[_OUTPUT_KEY] = self._observed()  # type: ignore[attr-defined]
            return
        if not self.devices:
            self._observe_device()
        self._report_lost_cases()
        self._write_run_files()

    def _write_run_files(self) -> None:
        config = self.config
        environment = {
            **report_meta.base_environment(config.rootpath),
            "device": ", ".join(sorted(self.devices)) or "not used",
            "backend": ", ".join(sorted(self.backends)) or "not used",
            "launcher": config.getoption(options.LAUNCHER),
            "world_sizes": ", ".join(map(str, sorted(self.world_sizes))) or "none",
            "implementation": options.impl_spec(config),
            "xdist_workers": str(getattr(config.option, "numprocesses", None) or 0),
        }
        report_meta.write(Path(config.option.allure_report_dir), environment)
