"""Whether a JSON summary and an Allure results folder are one run, and what the results say of themselves.

The report shows a verdict from the suite's JSON summary beside the cases of
the results folder; the two must be one run.  Every result carries the
session's run id and its case id as labels
(:data:`~conformance.record.report_properties.RUN_LABEL`,
:data:`~conformance.record.report_properties.CASE_LABEL`), ``environment.properties``
the run id and the implementation, and the summary the same run id and
implementation: :func:`disagreements` names every way they differ (results of
several runs in one folder among them), and the build then shows no verdict.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.record.report_properties import CASE_LABEL, RUN_LABEL


@dataclass(frozen=True)
class ResultsRun:
    """What an Allure results folder says of the run (or runs) that wrote it."""

    #: Run id -> results carrying it ("" for results that carry none).
    runs: Counter[str] = field(default_factory=Counter)
    #: ``environment.properties``, written once per session by the run that wrote it last.
    environment: Mapping[str, str] = field(default_factory=dict)
    #: Case id -> the report's id of its result (the md5 of the result's uuid): a link ``#/<id>`` opens it.
    result_ids: Mapping[str, str] = field(default_factory=dict)
    #: ``(fullName, name)`` -> case id: a report's history written before case ids names its results so.
    cases_by_title: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: Results by status, and ``total``.
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def run_ids(self) -> set[str]:
        """Every run id the results name, in their labels or their environment."""
        named = {run for run in self.runs if run}
        return named | ({self.environment["run_id"]} if self.environment.get("run_id") else set())


def read_environment(results: Path) -> dict[str, str]:
    """``environment.properties`` as written by the suite (keys and values unescaped)."""
    path = results / "environment.properties"
    if not path.is_file():
        return {}
    pairs = (re.split(r"(?<!\\)=", line, maxsplit=1) for line in path.read_text(encoding="utf-8").splitlines())
    return {key.replace("\\", ""): value.replace("\\n", "\n") for key, value in
            (pair for pair in pairs if len(pair) == 2)}


def read_results(results: Path) -> ResultsRun:
    """The run ids, case ids, titles and statuses of every ``*-result.json`` in ``results``."""
    runs: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    result_ids: dict[str, str] = {}
    by_title: dict[tuple[str, str], str] = {}
    for path in results.glob("*-result.json"):
        try:
            doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # Allure skips it too
        labels = {label.get("name"): label.get("value") for label in doc.get("labels", ())}
        runs[str(labels.get(RUN_LABEL) or "")] += 1
        statuses[str(doc.get("status") or "unknown")] += 1
        case = labels.get(CASE_LABEL)
        if case and doc.get("uuid"):
            result_ids[str(case)] = hashlib.md5(str(doc["uuid"]).encode()).hexdigest()
            by_title[(str(doc.get("fullName", "")), str(doc.get("name", "")))] = str(case)
    statuses["total"] = sum(statuses.values())
    return ResultsRun(runs, read_environment(results), result_ids, by_title, statuses)


def disagreements(summary: Mapping[str, Any], found: ResultsRun) -> list[str]:
    """Every way ``summary`` and the results are not one run (empty: they are).

    The run ids decide; the implementations are compared too, which is all
    there is to compare for results and summaries written before run ids.
    A result that carries no run id (``coc-matrix --alluredir`` adds one) is
    no other run.
    """
    problems = []
    ids = found.run_ids  # results without one (coc-matrix --alluredir writes one) are no other run
    if len(ids) > 1:
        problems.append(f"the results folder holds results of {len(ids)} runs ({', '.join(sorted(ids))}): "
                        "empty it before each run (pytest --clean-alluredir)")
    want = str(summary.get("run_id") or "")
    if want and not ids:
        problems.append(f"the summary is of run {want}; the results carry no run id (written by an older suite)")
    elif want and want not in ids:
        problems.append(f"the summary is of run {want}; the results are of run {', '.join(sorted(ids))}")
    elif not want and ids:
        problems.append(f"the summary carries no run id (written by an older suite); the results are of run "
                        f"{', '.join(sorted(ids))}")
    ours, theirs = str(summary.get("implementation") or ""), found.environment.get("implementation", "")
    if ours and theirs and ours != theirs:
        problems.append(f"the summary judged {ours}; the results judged {theirs}")
    return problems
