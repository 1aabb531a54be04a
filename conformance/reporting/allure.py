"""What a conformance case tells Allure: labels, parameters and attachments.

The one module that imports ``allure``.  The hooks in
:mod:`conformance.reporting.hooks` describe every case from its parametrization,
attach what its checks recorded (:mod:`conformance.record.evidence`) and, on
failure, every rank's evidence.  Every function returns at once unless
allure-pytest records results (``--alluredir``).
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import allure

from conformance.record.levels import Level
from conformance.record.report_properties import CASE_LABEL, RUN_LABEL
from conformance.record.verdicts import FAILED, JUDGED, NOT_JUDGED, NOT_OFFERED, PASSED, outcome_of
from conformance.record.verdicts import case_outcome as outcome_of_checks

if TYPE_CHECKING:
    import pytest

    from coc_shared.timeline import Timeline
    from conformance.harness.case_errors import CaseError
    from conformance.record.comparison import Comparison
    from conformance.record.evidence import CaseEvidence

EPIC = "CoC"
#: Parameters shown but left out of the history id, so trends follow a case across machines and
#: implementations (a patch's run lines up with its accepted baseline's).
HISTORY_EXCLUDED = frozenset({"device", "implementation"})
#: A case's severity: that of the most important level among its failed checks, else among its checks.
LEVEL_SEVERITY = {Level.MUST.value: "critical", Level.STRUCTURE.value: "normal", Level.SHOULD.value: "minor"}
SEVERITIES = tuple(level.value for level in allure.severity_level)
_MAX_TEXT = 80
#: Tables are markdown: the report renders them (it shows CSV as raw text).
_MARKDOWN = "text/markdown"

_active = False
_figures = "failed"  # --coc-figures
_described: set[str] = set()  # what the running test described itself (defaults skip it)
_warned_no_plots = False


def activate(on: bool, *, figures: str = "failed") -> None:
    """Switch recording on or off (the hooks do, at configure and unconfigure).

    ``figures`` (``--coc-figures``): which comparisons get figures: ``failed``, ``all`` or ``none``.
    """
    global _active, _figures
    _active, _figures = on, figures


def is_active() -> bool:
    return _active


class _Shown:
    """A parameter value Allure shows verbatim (it quotes plain strings)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def readable(value: Any) -> str:
    """A short, stable text for a parameter value (no memory addresses)."""
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (str, bool, int, float)):
        text = str(value)
    elif type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        text = str(value).removeprefix("torch.")
    elif isinstance(getattr(value, "name", None), str) or isinstance(getattr(value, "id", None), str):
        # its name, else its id: a perf case's id leaves out its profile and TP, which its name holds
        text = value.name if isinstance(getattr(value, "name", None), str) else value.id
    elif isinstance(value, tuple) and value and all(isinstance(v, int) for v in value):
        text = "x".join(map(str, value))  # a shape
    elif isinstance(value, Mapping):
        text = ", ".join(f"{k}={readable(v)}" for k, v in value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        text = "[" + ", ".join(readable(v) for v in value) + "]"
    elif isinstance(value, type) or callable(value):
        text = getattr(value, "__qualname__", type(value).__name__)
    else:
        text = str(value)
    if len(text) <= _MAX_TEXT:
        return text
    # Distinct long values must stay distinct: Allure 3 keys history on the shown text.
    return f"{text[:_MAX_TEXT - 12]}...{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def add_parameters(params: Mapping[str, Any]) -> None:
    """Show ``params`` with readable values; those in :data:`HISTORY_EXCLUDED` stay out of history."""
    if not _active:
        return
    for name, value in params.items():
        allure.dynamic.parameter(name, _Shown(readable(value)), excluded=name in HISTORY_EXCLUDED or None)


def describe_case(*, feature: str, story: str, title: str | None = None, severity: str | None = None,
                  **params: Any) -> None:
    """Label the running case: feature (op or layer), story (mode), title, severity, parameters.

    Call from a test body; what it names replaces the defaults derived from
    the test's name and parametrization (severity: a marker, else normal).
    ``device`` is shown but excluded from the history id.
    """
    if not _active:
        return
    allure.dynamic.feature(feature)
    allure.dynamic.story(story)
    _described.update(("feature", "story"))
    if severity is not None:
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
        allure.dynamic.severity(allure.severity_level(severity))
        _described.add("severity")
    if title is not None:
        allure.dynamic.title(title)
        _described.add("title")
    add_parameters(params)


def begin_case(params: Mapping[str, Any], *, run: str, case: str) -> None:
    """Before the case's fixtures: epic, run and case ids, and parameters (before allure-pytest adds raw ones)."""
    _described.clear()
    if _active:
        allure.dynamic.epic(EPIC)
        allure.dynamic.label(RUN_LABEL, run)
        allure.dynamic.label(CASE_LABEL, case)
        add_parameters(params)


def finish_case(item: pytest.Item, *, feature: str, story: str, title: str) -> None:
    """After the case: the defaults for whatever neither the test nor a marker described."""
    described = _described | {mark.kwargs.get("label_type") for mark in item.iter_markers("allure_label")}
    if getattr(getattr(item, "obj", None), "__allure_display_name__", None) is not None:
        described.add("title")  # @allure.title
    _described.clear()
    if not _active:
        return
    if "feature" not in described:
        allure.dynamic.feature(feature)
    if "story" not in described:
        allure.dynamic.story(story)
    if "severity" not in described:
        allure.dynamic.severity(allure.severity_level.NORMAL)
    if "title" not in described:
        allure.dynamic.title(title)


def attach_text(body: str, name: str) -> None:
    if _active and body:
        allure.attach(body, name=name, attachment_type=allure.attachment_type.TEXT)


def attach_evidence(error: CaseError) -> None:
    """Every rank's stack (hangs, crashes), traceback and log, one attachment each."""
    for rank, stack in sorted(error.stacks.items()):
        attach_text(stack, f"rank {rank} stack")
    for outcome in error.outcomes:
        if outcome.error is not None:
            attach_text(outcome.error.traceback, f"rank {outcome.rank} traceback")
        attach_text(outcome.log, f"rank {outcome.rank} log")


def _attach_png(png: bytes | None, name: str) -> None:
    global _warned_no_plots
    if png is not None:
        allure.attach(png, name=name, attachment_type=allure.attachment_type.PNG)
    elif not _warned_no_plots:
        _warned_no_plots = True
        warnings.warn("matplotlib is not installed (pip install '.[report]'): "
                      "the Allure report has no figures", stacklevel=3)


def _table(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column markdown table (the report renders it as one): floats in 3 digits, tuples as lists."""
    def cell(value: Any) -> str:
        text = f"{value:.3e}" if isinstance(value, float) else str(list(value) if isinstance(value, tuple) else value)
        return text.replace("|", "\\|").replace("\n", " ")

    return "| statistic | value |\n|---|---|\n" + "".join(f"| {cell(k)} | {cell(v)} |\n" for k, v in rows)


#: Upper edges of the decades of |diff| / bound counted in every statistics table.
_DECADES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def ratio_decades(abs_diff: Any, bound: Any) -> list[tuple[str, int]]:
    """How many elements have |diff| / bound in each decade: the histogram as table rows."""
    import numpy as np

    diff, bnd = np.ravel(abs_diff), np.ravel(bound)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bnd > 0, diff / bnd, np.where(diff > 0, np.inf, 0.0))
    rows = [("|diff| / bound = 0", int((ratio == 0).sum()))]
    low = 0.0
    for high in _DECADES:
        rows.append((f"|diff| / bound in ({low:g}, {high:g}]", int(((ratio > low) & (ratio <= high)).sum())))
        low = high
    rows.append((f"|diff| / bound > {low:g} (violations)", int((ratio > low).sum())))
    return rows


def attach_comparison(comparison: Comparison, *, failed: bool | None = None) -> None:
    """Error statistics and their distribution as a table; figures as ``--coc-figures`` says.

    ``failed`` defaults to whether the bound was violated.  A failed comparison
    gets a histogram and a heat-map of |diff| (unless figures are ``none``), a
    passing one a histogram only with ``--coc-figures all``: drawing is the
    dearest thing a passing case would do.
    """
    if not _active:
        return
    stats = comparison.stats
    failed = failed if failed is not None else not stats.ok
    rows = [*stats.as_dict().items(), *ratio_decades(comparison.abs_diff, comparison.bound)]
    allure.attach(_table(rows), name=f"{stats.name}: error statistics", attachment_type=_MARKDOWN,
                  extension="md")
    if _figures == "none" or not (failed or _figures == "all"):
        return
    from conformance.reporting import plots

    _attach_png(plots.error_histogram(comparison.abs_diff, comparison.bound, title=stats.name),
                f"{stats.name}: |diff| / bound")
    if failed and comparison.abs_diff.size:
        _attach_png(plots.diff_heatmap(comparison.abs_diff, comparison.bound,
                                       title=f"{stats.name} {stats.dtype} {list(stats.shape)}"),
                    f"{stats.name}: |diff| heat-map")


#: Per-block ``(start, end)`` pairs, or per-block durations (laid back to back).
Lane = Sequence[Any]


def _intervals(lane: Lane) -> list[tuple[float, float]]:
    if not lane or not isinstance(lane[0], (int, float)):
        return [(float(start), float(end)) for start, end in lane]
    ends = list(itertools.accumulate(float(d) for d in lane))
    return list(zip([0.0, *ends[:-1]], ends, strict=True))


def _lanes(source: Timeline | Mapping[str, Lane]) -> dict[str, list[tuple[float, float]]]:
    if not isinstance(source, Mapping):
        return {"matmul": list(source.mm), "comm": list(source.comm)}
    return {("matmul" if key == "mm" else key): _intervals(lane) for key, lane in source.items()}


def attach_timeline(predicted: Timeline | None, measured: Timeline | Mapping[str, Lane] | None,
                    title: str, *, unit: str = "us") -> None:
    """A lane chart of the predicted and measured pipeline, in ``unit`` (that of the model's costs).

    ``measured`` is a Timeline or ``{"mm": lane, "comm": lane}``; a lane is a
    list of per-block ``(start, end)`` or of per-block durations.
    """
    if not _active or (predicted is None and measured is None):
        return
    from conformance.reporting import plots

    rows: dict[str, list[tuple[float, float]]] = {}
    spans = []
    for what, source in (("predicted", predicted), ("measured", measured)):
        if source is None:
            continue
        lanes = _lanes(source)
        rows.update({f"{what} {lane}": intervals for lane, intervals in lanes.items()})
        end = max((e for intervals in lanes.values() for _, e in intervals), default=0.0)
        spans.append(f"{what} {end:.3g} {unit}")
    _attach_png(plots.lanes(rows, title=f"{title}: {', '.join(spans)}", unit=unit), f"{title}: timeline")


def attach_case_evidence(found: CaseEvidence) -> None:
    """Everything the case's checks recorded, attached after its call."""
    if not _active:
        return
    if found.description:
        describe_case(**found.description)
    for comparison, failed in found.comparisons:
        attach_comparison(comparison, failed=failed)
    for title, body in found.texts:
        attach_text(body, title)
    for title, predicted, measured, unit in found.timelines:
        attach_timeline(predicted, measured, title, unit=unit)


def _worst(levels: Iterable[str]) -> str | None:
    """The most important of ``levels`` (MUST, STRUCTURE, SHOULD; unknown ones last)."""
    order = list(LEVEL_SEVERITY)
    return min(levels, key=lambda lvl: order.index(lvl) if lvl in order else len(order), default=None)


#: What a case that did not pass is, as the suite reports it (the summary's outcomes).
KNOWN, NOT_GATED = "known", "not-gated"
#: Allure's status for each check outcome; anything else (not judged, a newer outcome) is never "passed".
_STEP_STATUS = {PASSED: "passed", FAILED: "failed"}


def check_outcome(check: Mapping[str, Any], case_outcome: str) -> str:
    """A check's outcome as the report shows it: a failed check of a known or ungated case says so."""
    outcome = outcome_of(check)
    if outcome == FAILED and case_outcome in (KNOWN, NOT_GATED):
        return "known" if case_outcome == KNOWN else "failed, not gated"
    return outcome


#: How much a check's outcome says against the implementation: a level's tag names its worst one.
_SEVERITY_OF_OUTCOME = {FAILED: 0, "failed, not gated": 1, "known": 2, NOT_JUDGED: 3, NOT_OFFERED: 3, PASSED: 5}


def level_tags(checks: Sequence[Mapping[str, Any]], case_outcome: str = "passed") -> list[str]:
    """One tag per level the case holds, naming the worst that came of its checks: ``MUST failed`` (never
    beside ``MUST passed``), ``SHOULD known``, ``STRUCTURE not judged``, ``MUST passed`` (every check passed)."""
    worst: dict[str, str] = {}
    for check in checks:
        level, outcome = str(check["level"]), check_outcome(check, case_outcome)
        if level not in worst or _SEVERITY_OF_OUTCOME.get(outcome, 4) < _SEVERITY_OF_OUTCOME.get(worst[level], 4):
            worst[level] = outcome
    order = list(LEVEL_SEVERITY)
    return [f"{level} {worst[level]}" for level in sorted(worst, key=lambda lvl: (
        order.index(lvl) if lvl in order else len(order), lvl))]


def label_levels(checks: Sequence[Mapping[str, Any]], case_outcome: str = "passed") -> None:
    """Tags (:func:`level_tags`), ``requirement`` and severity from the case's checks: what failed, at which level.

    ``requirement`` and the severity follow the most important failed level
    (MUST: critical, STRUCTURE: normal, SHOULD: minor), else the most
    important level the case judged; a case that judged no check has
    requirement ``not judged`` (``not offered`` when every check says so).
    """
    if not _active or not checks:
        return
    for tag in level_tags(checks, case_outcome):
        allure.dynamic.tag(tag)
    failed = _worst(str(c["level"]) for c in checks if outcome_of(c) == FAILED)
    judged = _worst(str(c["level"]) for c in checks if outcome_of(c) in JUDGED)
    unjudged = NOT_OFFERED if all(outcome_of(c) == NOT_OFFERED for c in checks) else NOT_JUDGED
    allure.dynamic.label("requirement", failed or judged or unjudged)
    severity = LEVEL_SEVERITY.get(failed or judged or _worst(str(c["level"]) for c in checks) or "", "normal")
    if "severity" not in _described:
        allure.dynamic.severity(allure.severity_level(severity))
        _described.add("severity")


def _open_result(config: pytest.Config) -> Any:
    """allure-pytest's result of the running case (None when it records none)."""
    listener = config.pluginmanager.get_plugin("allure_listener")
    return listener.allure_logger.get_test(None) if listener is not None else None


def _step(result: Any, name: str, status: str, message: str = "", seconds: float | None = None) -> None:
    """A step ending now; ``seconds`` long when known (Allure shows a step without a time as "unknown")."""
    from allure_commons.model2 import StatusDetails, TestStepResult
    from allure_commons.utils import now

    stop = now()
    start = None if seconds is None else stop - round(seconds * 1000)
    result.steps.append(TestStepResult(name=name, status=status, start=start, stop=None if start is None else stop,
                                       statusDetails=StatusDetails(message=message) if message else None))


def check_title(check: Mapping[str, Any], case_outcome: str) -> str:
    """``[MUST] numerics: failed``: a check's step title, and the first line of a failed case's message."""
    return f"[{check['level']}] {check['name']}: {check_outcome(check, case_outcome)}"


def show_checks(config: pytest.Config, checks: Sequence[Mapping[str, Any]], case_outcome: str,
                call_seconds: float | None = None) -> None:
    """One step per check, ``[MUST] numerics: failed``, with its message and the time it took; only passed
    checks are "passed".  A check recorded from the test body itself (no time of its own) took the call's
    time when it is the case's only check."""
    result = _open_result(config) if _active else None
    if result is None:
        return
    for check in checks:
        outcome = check_outcome(check, case_outcome)
        seconds = check.get("seconds")
        if seconds is None and len(checks) == 1:
            seconds = call_seconds
        _step(result, check_title(check, case_outcome), _STEP_STATUS.get(outcome, "skipped"),
              str(check.get("message") or ""), seconds)


def show_reason(config: pytest.Config, what: str, reason: str, seconds: float | None = None) -> None:
    """Why a case was skipped, known, not gated or not judged: a step above its checks (Allure shows no
    message at the top of a skipped case), as long as the phase that decided it (``seconds``)."""
    result = _open_result(config) if _active else None
    if result is not None:
        _step(result, f"{what}: {reason}", "skipped", seconds=seconds)
        result.steps.insert(0, result.steps.pop())


def not_judged(config: pytest.Config, checks: Sequence[Mapping[str, Any]]) -> None:
    """A case that judged nothing (``case_outcome``: not judged) is shown skipped, with why, never as passed."""
    from allure_commons.model2 import Status, StatusDetails

    result = _open_result(config) if _active else None
    if result is None or not checks or outcome_of_checks(outcome_of(c) for c in checks) != NOT_JUDGED:
        return
    why = "; ".join(f"{c['name']}: {c.get('message') or 'nothing to judge'}" for c in checks)
    result.status = Status.SKIPPED
    result.statusDetails = StatusDetails(message=f"{NOT_JUDGED}: {why}")


def link_expectations(entries: Sequence[Mapping[str, Any]]) -> None:
    """Each expectations entry the case matched: its file and line, its reason, and its own link."""
    if not _active:
        return
    for entry in entries:
        source = str(entry.get("source") or "")
        path, _, line = source.rpartition(":")
        url = f"file://{path}#L{line}" if path and line.isdigit() else f"file://{source}"
        name = f"expectations {source.rsplit('/', 1)[-1] or 'entry'}: {entry.get('pattern', '')}"
        allure.dynamic.link(url, name=f"{name} ({entry.get('reason', '')})"[:200])
        if entry.get("link"):
            allure.dynamic.issue(str(entry["link"]), name=str(entry["link"]))


def show_failure(config: pytest.Config, command: str, frames: str | None,
                 checks: Sequence[Mapping[str, Any]] = (), case_outcome: str = "failed") -> None:
    """The failed checks with their levels first (the header of the case), then the message, the command that
    reproduces the case, and the traceback cut to the check's frames; shown once more in the failed check's step
    (the same details: Allure then shows them nowhere else)."""
    result = _open_result(config) if _active else None
    details = getattr(result, "statusDetails", None)
    if result is None or details is None:
        return
    failed = "; ".join(check_title(c, case_outcome) for c in checks if outcome_of(c) == FAILED)
    details.message = "\n".join(filter(None, [failed, f"{details.message or ''}\n\nreproduce: {command}".lstrip()]))
    if frames is not None:
        details.trace = frames
    step = next((step for step in result.steps if step.status == "failed"), None)
    if step is not None:
        step.statusDetails = details


def report_lost_case(results_dir: str, nodeid: str, why: str, *, run: str) -> None:
    """A broken result for a collected case that has none (its worker died, or never ran it).

    Written by the controller, so the report lists every lost case under
    "hang / timeout" and its count of results matches the cases collected.
    """
    from allure_commons.logger import AllureFileLogger
    from allure_commons.model2 import Label, Status, StatusDetails, TestResult
    from allure_commons.utils import md5, now, uuid4

    from conformance.caseids import case_id
    from conformance.harness.case_errors import WorkerLost

    module, _, test = nodeid.partition("::")
    full_name = f"{module.removesuffix('.py').replace('/', '.')}#{test.split('[')[0]}"
    moment = now()
    AllureFileLogger(results_dir).report_result(TestResult(
        uuid=uuid4(), name=test, fullName=full_name, testCaseId=md5(full_name), historyId=md5(nodeid),
        status=Status.BROKEN, start=moment, stop=moment,
        statusDetails=StatusDetails(message=f"{WorkerLost.__module__}.{WorkerLost.__name__}: {why}"),
        labels=[Label("epic", EPIC), Label("feature", module.rsplit("/", 1)[-1].removesuffix(".py")),
                Label("severity", "critical"), Label("framework", "pytest"), Label(RUN_LABEL, run),
                Label(CASE_LABEL, case_id(nodeid))],
    ))


def attach_exploration(explored: Mapping[str, Any] | None) -> None:
    """What an exploration did: cases per dimension, cases per second, where the time went, minimal failing cases."""
    if not _active or not explored:
        return
    import json

    rows = [("cases", explored["cases"]), ("cases per second", explored["cases_per_s"]),
            *((f"time: {k} (s)", v) for k, v in explored["time_s"].items()),
            *((f"kind {k}: {what}", v) for k, figures in explored.get("per_kind", {}).items()
              for what, v in figures.items()),
            *((f"not offered: {k}", why) for k, why in explored.get("not_offered", {}).items()),
            *((f"set aside, not run: {why}", count) for why, count in explored.get("outside", {}).items()),
            *((f"explored: {k}", v) for k, v in explored["per_dimension"].items())]
    allure.attach(_table(rows), name="exploration", attachment_type=_MARKDOWN, extension="md")
    for finding in explored["findings"]:
        allure.attach(json.dumps(finding, indent=1), name=f"minimal case: {finding['level']} {finding['check']}",
                      attachment_type=allure.attachment_type.JSON)
