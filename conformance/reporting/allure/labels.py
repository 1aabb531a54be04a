"""A case's labels in Allure: epic, feature, story, title, severity, parameters, tags and links.

The defaults come from the case's parametrization and kind; what a test
describes itself (:func:`describe_case`) wins.  Parameter values are shown as
short, stable texts (:func:`readable`), so history follows a case across runs.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import allure

from conformance.record.levels import Level
from conformance.record.report_properties import CASE_LABEL, RUN_LABEL
from conformance.record.verdicts import FAILED, JUDGED, NOT_JUDGED, NOT_OFFERED, PASSED, outcome_of
from conformance.reporting.allure import recording
from conformance.reporting.allure.steps import check_outcome

if TYPE_CHECKING:
    import pytest

EPIC = "CoC"
#: Parameters shown but left out of the history id, so trends follow a case across machines and
#: implementations (a patch's run lines up with its accepted baseline's).
HISTORY_EXCLUDED = frozenset({"device", "implementation"})
#: A case's severity: that of the most important level among its failed checks, else among its checks.
LEVEL_SEVERITY = {Level.MUST.value: "critical", Level.STRUCTURE.value: "normal", Level.SHOULD.value: "minor"}
SEVERITIES = tuple(level.value for level in allure.severity_level)
_MAX_TEXT = 80


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
    if not recording.is_active():
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
    if not recording.is_active():
        return
    allure.dynamic.feature(feature)
    allure.dynamic.story(story)
    recording.described.update(("feature", "story"))
    if severity is not None:
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
        allure.dynamic.severity(allure.severity_level(severity))
        recording.described.add("severity")
    if title is not None:
        allure.dynamic.title(title)
        recording.described.add("title")
    add_parameters(params)


def begin_case(params: Mapping[str, Any], *, run: str, case: str) -> None:
    """Before the case's fixtures: epic, run and case ids, and parameters (before allure-pytest adds raw ones)."""
    recording.described.clear()
    if recording.is_active():
        allure.dynamic.epic(EPIC)
        allure.dynamic.label(RUN_LABEL, run)
        allure.dynamic.label(CASE_LABEL, case)
        add_parameters(params)


def finish_case(item: pytest.Item, *, feature: str, story: str, title: str) -> None:
    """After the case: the defaults for whatever neither the test nor a marker described."""
    described = recording.described | {mark.kwargs.get("label_type") for mark in item.iter_markers("allure_label")}
    if getattr(getattr(item, "obj", None), "__allure_display_name__", None) is not None:
        described.add("title")  # @allure.title
    recording.described.clear()
    if not recording.is_active():
        return
    if "feature" not in described:
        allure.dynamic.feature(feature)
    if "story" not in described:
        allure.dynamic.story(story)
    if "severity" not in described:
        allure.dynamic.severity(allure.severity_level.NORMAL)
    if "title" not in described:
        allure.dynamic.title(title)


def _worst(levels: Iterable[str]) -> str | None:
    """The most important of ``levels`` (MUST, STRUCTURE, SHOULD; unknown ones last)."""
    order = list(LEVEL_SEVERITY)
    return min(levels, key=lambda lvl: order.index(lvl) if lvl in order else len(order), default=None)


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
    if not recording.is_active() or not checks:
        return
    for tag in level_tags(checks, case_outcome):
        allure.dynamic.tag(tag)
    failed = _worst(str(c["level"]) for c in checks if outcome_of(c) == FAILED)
    judged = _worst(str(c["level"]) for c in checks if outcome_of(c) in JUDGED)
    unjudged = NOT_OFFERED if all(outcome_of(c) == NOT_OFFERED for c in checks) else NOT_JUDGED
    allure.dynamic.label("requirement", failed or judged or unjudged)
    severity = LEVEL_SEVERITY.get(failed or judged or _worst(str(c["level"]) for c in checks) or "", "normal")
    if "severity" not in recording.described:
        allure.dynamic.severity(allure.severity_level(severity))
        recording.described.add("severity")


def link_expectations(entries: Sequence[Mapping[str, Any]]) -> None:
    """Each expectations entry the case matched: its file and line, its reason, and its own link."""
    if not recording.is_active():
        return
    for entry in entries:
        source = str(entry.get("source") or "")
        path, _, line = source.rpartition(":")
        url = f"file://{path}#L{line}" if path and line.isdigit() else f"file://{source}"
        name = f"expectations {source.rsplit('/', 1)[-1] or 'entry'}: {entry.get('pattern', '')}"
        allure.dynamic.link(url, name=f"{name} ({entry.get('reason', '')})"[:200])
        if entry.get("link"):
            allure.dynamic.issue(str(entry["link"]), name=str(entry["link"]))
