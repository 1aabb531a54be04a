"""The report's baseline view: this run against an earlier one, case by case and check by check.

The comparison is ``coc-gate``'s own (:mod:`conformance.record.run_diff`):
the view walks :meth:`~conformance.record.run_diff.RunDiff.sections` in their
order (new failures, new failing checks in failed cases, hangs and crashes,
unexpected passes, lost judgment -- a case or check judged in the baseline
and skipped, not offered, not judged or missing now -- and perf regressions,
all red; then lost judgment the expectations file expects, and fixes), each
case with the checks whose outcome changed.  A
baseline is a run's JSON summary (or a folder holding one, or Allure
results), or an earlier report's history (``*.jsonl``: its last run, case by
case, without checks).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.record.run_diff import RunDiff
from conformance.record.runs import Run, RunError, load_run

#: Cases each section of the view lists before "... and N more".
LISTED = 50
#: Characters of a cell the view shows (the whole cell is its tooltip).
CELL = 120
#: An Allure history status as a case outcome of the summary.
_OUTCOMES = {"passed": "passed", "failed": "failed", "broken": "error", "skipped": "skipped"}


def history_run(path: Path, cases_by_title: Mapping[tuple[str, str], str]) -> Run:
    """The last run of a report's history (``allure-history.jsonl``), case by case: each result named by the case
    id it carries (label ``coc_case``), else by this run's case of the same full name and title."""
    from conformance.record.report_properties import CASE_LABEL

    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        last: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: {exc}") from None
    if not isinstance(last.get("testResults"), dict):
        raise RunError(f"{path}: not an Allure history (no run with testResults)")
    cases = {}
    for history_id, result in last["testResults"].items():
        labelled = [str(label.get("value")) for label in result.get("labels", ()) if label.get("name") == CASE_LABEL]
        title = (str(result.get("fullName", "")), str(result.get("name", "")))
        cid = labelled[0] if labelled else cases_by_title.get(title, f"{title[0]} {title[1]}".strip() or history_id)
        cases[cid] = {"id": cid, "outcome": _OUTCOMES.get(str(result.get("status")), "error"),
                      "failure": {"category": "-", "message": ""}}
    return Run(f"{path} (its last run)", "?", cases)


def load(path: Path, cases_by_title: Mapping[tuple[str, str], str]) -> Run:
    """A baseline: a report's history (``*.jsonl``), else what ``coc-gate --baseline`` reads."""
    if path.suffix == ".jsonl" and path.is_file():
        return history_run(path, cases_by_title)
    return load_run(path)


def _short(text: str) -> str:
    return text if len(text) <= CELL else text[:CELL - 3] + "..."


def summary_line(diff: RunDiff) -> str:
    """``RED: 4 new failures, 1 fixes`` -- the comparison's colour and each section's count."""
    counts = ", ".join(f"{len(section.rows)} {section.title.split(' (')[0].lower()}" for section in diff.sections)
    return f"{'RED' if diff.red else 'GREEN'}: {counts or 'no change in conformance or performance'}"


def view(diff: RunDiff, result_ids: Mapping[str, str]) -> str:
    """The baseline view as HTML: one table per section, each case linked to its result (``result_ids``: case
    id -> the report's result id), with the checks whose outcome changed."""
    esc = html.escape
    parts = [f'<div class="coc-baseline" data-testid="coc-baseline" data-outcome="{"red" if diff.red else "green"}">',
             f'<p class="coc-title">Against the baseline <code>{esc(diff.baseline.source)}</code> '
             f"({len(diff.baseline.cases)} cases): {esc(summary_line(diff))}</p>"]
    for section in diff.sections:
        header = "".join(f"<th>{esc(column)}</th>" for column in ("case", *section.columns, "checks that changed"))
        parts.append(f'<details open data-testid="coc-baseline-section" data-outcome="{"red" if section.red else ""}">'
                     f"<summary>{esc(section.title)} ({len(section.rows)})</summary><table><tr>{header}</tr>")
        for row in section.rows[:LISTED]:
            link = result_ids.get(row.case)
            case = f'<a href="#/{link}">{esc(row.case)}</a>' if link else esc(row.case)
            cells = " ".join(f'<td title="{esc(cell)}">{esc(_short(cell))}</td>' for cell in row.cells)
            changed = "<br> ".join(esc(change) for change in row.changes)
            parts.append(f'<tr data-testid="coc-baseline-row"><td>{case}</td> {cells} <td class="coc-changes">'
                         f"{changed}</td></tr>")
        parts.append("</table>")
        if len(section.rows) > LISTED:
            parts.append(f"<p>... and {len(section.rows) - LISTED} more</p>")
        parts.append("</details>")
    return "".join(parts) + "</div>"
