"""pytest hooks that describe every case to Allure; the plugin registers them with ``--alluredir``.

* setup: epic, the implementation and every parametrize value as readable
  parameters (before allure-pytest adds raw ones; ``device`` and
  ``implementation`` out of history);
* teardown: default feature (the kind of case, :func:`conformance.case_kinds.kind_of`), story (its op or layer),
  severity and title (with parameter names) for what the test did not
  describe through :func:`conformance.reporting.allure.labels.describe_case`;
* a failing :class:`~conformance.harness.case_errors.CaseError`: every rank's evidence;
* after the call: what the checks recorded (the evidence of the case's record, :mod:`conformance.record.evidence`):
  comparisons, texts, timelines and the case's own description;
* each report as it is logged (its final outcome: known, not gated): one
  step per check, tags, ``requirement`` and severity from the failed level,
  not judged shown skipped, why a case was skipped / known / not gated, its
  expectations entry, and on a failure the command that reproduces it and
  the check's own frames;
* session end: ``categories.json`` and ``environment.properties``.  Under
  xdist only the controller writes them, after every worker has reported
  what it ran on (``workeroutput``); allure-pytest's per-test files carry
  unique names, so workers never clobber each other.
"""

from __future__ import annotations

import shlex
import sys
import traceback
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from conformance import options
from conformance.case_kinds import kind_of
from conformance.caseids import case_id
from conformance.harness.case_errors import CaseError
from conformance.record import report_properties
from conformance.record.item_verdicts import verdicts_of
from conformance.reporting import meta as report_meta
from conformance.reporting.allure import attachments, labels, recording, steps
from conformance.reporting.allure.labels import readable
from conformance.reporting.allure.lost_cases import report_lost_case
from conformance.roster import is_xdist_worker, roster, run_id

_OUTPUT_KEY = "coc_allure"
#: A lost case's feature when no worker lived to say what kind of case it was.
UNKNOWN_KIND = "kind unknown (every worker was lost)"


def _params(item: pytest.Item) -> dict[str, Any]:
    return dict(getattr(getattr(item, "callspec", None), "params", {}))


def _defaults(item: pytest.Item) -> dict[str, str]:
    """Feature (the kind of case), story (its op or layer, else the check) and title (with parameter names)."""
    params = _params(item)
    check = getattr(item, "originalname", item.name).removeprefix("test_").replace("_", " ")
    story = next((readable(params[k]) for k in ("op", "layer") if k in params), check)
    values = ", ".join(f"{name}={readable(v)}" for name, v in params.items())
    return {"feature": kind_of(item), "story": story,
            "title": check.capitalize() + (f" [{values}]" if values else "")}


def reproduce_command(config: pytest.Config, nodeid: str) -> str:
    """The command that runs this one case again as this run did: its node id and the options shaping it."""
    words = ["pytest", nodeid, options.IMPL, options.impl_spec(config)]
    gate, expectations = options.gate_spec(config), options.expectations_path(config)
    if gate != "all":
        words += [options.GATE, gate]
    if expectations is not None:
        words += [options.EXPECTATIONS, str(expectations)]
    for option in (options.TP, options.LAUNCHER, options.BACKEND, options.CPU_SLOTS, options.EXPLORE, options.SEED,
                   options.REPLAY):
        given = config.getoption(option)
        if given is not None and any(arg == option or arg.startswith(option + "=")
                                     for arg in config.invocation_params.args):
            words += [option, ",".join(map(str, given)) if isinstance(given, (list, tuple)) else str(given)]
    return shlex.join(words)


#: Frames of the suite's machinery, cut from the traceback a failed case shows.
_INTERNAL = ("/_pytest/", "/pluggy/", "/conformance/plugins/", "/conformance/reporting/", "/conformance/plugin.py",
             "/conformance/record/verdicts.py", "/contextlib.py")


def check_frames(exc: BaseException) -> str:
    """The failure's traceback without pytest's, pluggy's and the suite's hook frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not any(part in f.filename.replace("\\", "/") for part in _INTERNAL)]
    return "".join(traceback.format_list(frames))


class AllureHooks:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.world_sizes: set[int] = set()
        self.devices: set[str] = set()
        self.backends: set[str] = set()
        self.reported: set[str] = set()  # on the controller (or without xdist)
        self.frames: dict[str, str] = {}  # the running case's failure, cut to the check's frames
        #: Each collected case's kind (a lost case's feature): collected here, or reported by the xdist workers.
        self.kinds: dict[str, str] = {}

    def pytest_configure(self, config: pytest.Config) -> None:
        recording.activate(True, figures=config.getoption(options.FIGURES))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        recording.activate(False)

    @pytest.hookimpl(trylast=True)  # the cases that will run, deselection done
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.kinds = {item.nodeid: kind_of(item) for item in items}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        params = _params(item)
        self.world_sizes.update(params[p] for p in options.TP_PARAMS if isinstance(params.get(p), int))
        labels.begin_case({**params, "implementation": options.impl_spec(item.config)},
                             run=run_id(item.config), case=case_id(item.nodeid))
        verdicts_of(item).evidence.kept = True

    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        labels.finish_case(item, **_defaults(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
            None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, CaseError):
            attachments.attach_evidence(call.excinfo.value)
        if call.excinfo is not None and report.failed:
            self.frames[item.nodeid] = check_frames(call.excinfo.value)
        if call.when == "call":
            attachments.attach_case_evidence(verdicts_of(item).evidence)
            attachments.attach_exploration(report_properties.property_of(report, report_properties.EXPLORE))
        return report

    def _present(self, report: pytest.TestReport) -> None:
        """The case as a reviewer reads it: a step per check, why it did not pass, how to run it again."""
        config = self.config
        wasxfail = getattr(report, "wasxfail", None)
        not_gated = report_properties.property_of(report, report_properties.NOT_GATED)
        outcome = steps.NOT_GATED if wasxfail is not None and not_gated else \
            steps.KNOWN if wasxfail is not None else report.outcome
        checks = report_properties.property_of(report, report_properties.CHECKS) or []
        if report.when == "call":
            labels.label_levels(checks, outcome)
            steps.show_checks(config, checks, outcome, report.duration)
            steps.not_judged(config, checks)
            labels.link_expectations(report_properties.property_of(report, report_properties.EXPECTATION) or [])
        if wasxfail is not None:
            steps.show_reason(config, "failed but not gated" if not_gated else "known failure", wasxfail,
                                  report.duration)
        elif report.skipped and isinstance(report.longrepr, tuple):
            steps.show_reason(config, "skipped", str(report.longrepr[2]).removeprefix("Skipped: "),
                                  report.duration)
        if report.failed or wasxfail is not None:
            steps.show_failure(config, reproduce_command(config, report.nodeid),
                                   self.frames.pop(report.nodeid, None), checks, outcome)

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
        if report.when == "call" or report.failed or report.skipped:
            self._present(report)
        if not is_xdist_worker(self.config):
            self.reported.add(report.nodeid)

    def _report_lost_cases(self) -> None:
        """Crashed and never-run cases get a broken result each (the workers wrote none).

        Cases left unrun by ``-x`` or an interrupt, with no worker lost, stay absent.
        """
        results, run = self.config.option.allure_report_dir, run_id(self.config)
        lost = roster(self.config)
        for nodeid in lost.crashed:
            report_lost_case(results, nodeid, "the pytest worker running this case died (see the run's output for "
                                              "its last words)", run=run, feature=self._kind(nodeid))
        for nodeid in lost.collected if lost.crashed else ():
            if nodeid not in self.reported and nodeid not in lost.crashed:
                report_lost_case(results, nodeid, "never run: the run lost its workers before reaching this case",
                                 run=run, feature=self._kind(nodeid))

    def _kind(self, nodeid: str) -> str:
        """A lost case's kind, as a worker that finished collected it (every worker collects every case)."""
        return self.kinds.get(nodeid, UNKNOWN_KIND)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        seen = getattr(node, "workeroutput", {}).get(_OUTPUT_KEY, {})
        self.world_sizes.update(seen.get("world_sizes", ()))
        self.devices.update(seen.get("devices", ()))
        self.backends.update(seen.get("backends", ()))
        self.kinds.update(seen.get("kinds", {}))

    @pytest.hookimpl(tryfirst=True)  # lost cases are written before the summary counts results
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = self.config
        if is_xdist_worker(config):  # an xdist worker: report to the controller
            self._observe_device()
            config.workeroutput[_OUTPUT_KEY] = {**self._observed(), "kinds": self.kinds}  # type: ignore[attr-defined]
            return
        if not self.devices:
            self._observe_device()
        self._report_lost_cases()
        self._write_run_files()

    def _write_run_files(self) -> None:
        config = self.config
        environment = {  # what the run judged, and where, first: the overview shows 8 entries
            "implementation": options.impl_spec(config),
            "run_id": run_id(config),
            "device": ", ".join(sorted(self.devices)) or "not used",
            "backend": ", ".join(sorted(self.backends)) or "not used",
            "launcher": config.getoption(options.LAUNCHER),
            "world_sizes": ", ".join(map(str, sorted(self.world_sizes))) or "none",
            **report_meta.base_environment(config.rootpath),
            "xdist_workers": str(getattr(config.option, "numprocesses", None) or 0),
            # what determinism verdicts depended on: torch's switches, and the variables this run set
            **{name: value for name, value in report_meta.determinism_settings().items() if value is not None},
        }
        report_meta.write(Path(config.option.allure_report_dir), environment)
