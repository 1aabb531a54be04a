"""The verdict as the report shows it, from the run's JSON summary (and only when the summary and the results are
one run).

The summary is ``--summary``, else ``coc-summary.json`` inside the results
folder, where the suite writes it, else beside it.  It counts only when it is
complete and the same run as the results (:mod:`conformance.reporting.same_run`:
the run id both carry, and the implementation); otherwise there is NO VERDICT,
and why.  The verdict is counted by :mod:`conformance.record.level_tally`, the
terminal's own function: a level with no check judged is *not judged*, never
conformant; the report keys on the verdict's outcome as the record states it
(:class:`~conformance.record.level_tally.RunVerdict`), never on its text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.record.level_tally import NO_VERDICT, NOT_JUDGED, RunVerdict
from conformance.reporting import same_run

#: The suite's summary of a run, inside its results folder (written there by default) or beside it.
SUMMARY_NAME = "coc-summary.json"


def find_summary(results: Path, summary: Path | None) -> Path | None:
    """``summary`` if given, else the run's summary inside ``results``, else beside it (older suites wrote it
    there); None when there is none."""
    if summary is not None:
        return summary
    return next((path for path in (results / SUMMARY_NAME, results.parent / SUMMARY_NAME) if path.is_file()), None)


def _tally(summary: Mapping[str, Any]) -> tuple[Any, Any]:
    from conformance.record import level_tally
    from conformance.record.levels import Level

    gate = Level.parse_many(str(summary.get("gate") or "all"))
    checks = (check for case in summary.get("cases", []) for check in case.get("checks", ()))
    return level_tally.tally(checks, gate), gate


def run_verdict(summary: Mapping[str, Any]) -> RunVerdict:
    """What the run of ``summary`` comes to (:func:`conformance.record.level_tally.run_verdict`)."""
    from conformance.record import level_tally

    counts, gate = _tally(summary)
    outcomes: Mapping[str, int] = summary.get("outcomes", {})
    return level_tally.run_verdict(counts, gate, failed_cases=outcomes.get("failed", 0),
                                   suite_errors=outcomes.get("error", 0), missing=len(summary.get("missing", [])))


def verdict(summary: Mapping[str, Any], environment: Mapping[str, str]) -> dict[str, str]:
    """What a reviewer decides from, in the order the overview shows it.

    ``verdict``: the headline of :func:`run_verdict` (conformant,
    not conformant, not judged or not decided, per level); one entry per
    level, the terminal's line for it; ``cases``: every outcome the summary
    counts (any outcome other than passed is shown by its name, never as
    passed); then the implementation, device and profile.
    """
    from conformance.record import level_tally
    from conformance.record.levels import Level
    from conformance.record.report_properties import GATE_ENFORCED, GATE_NOT_RUN

    counts, gate = _tally(summary)
    cases = summary.get("cases", [])
    outcomes: Mapping[str, int] = summary.get("outcomes", {})
    shown = {"verdict": run_verdict(summary).headline}
    for level in Level:
        line = level_tally.level_line(level, counts, gate)
        if line is not None:
            shown[level.value] = line.removeprefix(level.value).strip()
    perf = [case for case in cases if "perf_gate" in case]
    enforced = sum(1 for case in perf if case["perf_gate"] == GATE_ENFORCED)
    not_run = sum(1 for case in perf if case["perf_gate"] == GATE_NOT_RUN)
    shown["implementation"] = str(summary.get("implementation", environment.get("implementation", "?")))
    shown["device"] = environment.get("device", "?")
    shown["profile"] = (f"perf gates enforced in {enforced} of {len(perf)} perf case(s)" if enforced else
                        f"no perf gate is enforced on this machine: {len(perf) - not_run} perf case(s) report, "
                        f"{not_run} not run; not judged" if perf else "no perf case ran")
    shown["cases"] = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items(), key=lambda kv: -kv[1]))
    return shown


def verdict_markdown(shown: Mapping[str, str], gate_result: str, summary: Mapping[str, Any]) -> str:
    """The verdict as a global attachment: headline, the terminal's table verbatim, the gate, what ran."""
    from conformance.record import level_tally

    counts, gate = _tally(summary)
    failed = [f"- `{case['nodeid']}`: " + "; ".join(f"[{c['level']}] {c['name']}" for c in case.get("checks", ())
                                                   if level_tally.column(c, gate) == "failed")
              for case in summary.get("cases", []) if case.get("outcome") in ("failed", "error")]
    return "\n".join([
        f"# {shown['verdict']}", "", "Requirement levels (checks), as the terminal printed them:", "", "```",
        *level_tally.lines(counts, gate), "```", "", f"Gate: {gate_result}", "",
        *(f"- {key}: {value}" for key, value in shown.items() if key in ("cases", "implementation", "device",
                                                                         "profile", "run")),
        *(["", "Failed cases and their failed gated checks:", "", *failed[:200]] if failed else []), ""])


def level_rows(summary: Mapping[str, Any]) -> list[tuple[str, list[tuple[str, int]], str]]:
    """Each level the terminal's table shows: its counts by column and its verdict (the banner's table)."""
    from conformance.record import level_tally
    from conformance.record.levels import Level

    counts, gate = _tally(summary)
    rows = []
    for level in Level:
        if level_tally.level_line(level, counts, gate) is None:
            continue
        columns = [*level_tally.COLUMNS, *sorted({o for (lvl, o) in counts if lvl == level.value} -
                                                 set(level_tally.COLUMNS))]
        rows.append((level.value, [(column, counts[(level.value, column)]) for column in columns],
                     level_tally.level_verdict(level, counts, gate)))
    return rows


def not_judged_cases(summary: Mapping[str, Any]) -> list[str]:
    """Cases that judged nothing: every check not judged, or skipped as not judged (a perf gate not run here)."""
    from conformance.record.verdicts import NOT_JUDGED

    return [str(case["id"]) for case in summary.get("cases", []) if case.get("outcome") == NOT_JUDGED
            or str(case.get("skip_reason", "")).startswith(NOT_JUDGED)]


@dataclass
class Judged:
    """The verdict the build reached: what the variables, the banner and the global errors say."""

    verdict: RunVerdict
    shown: dict[str, str]
    summary: Mapping[str, Any] | None  # the run's own summary; None when there is none or it is another run's
    summary_path: Path | None
    #: Why there is no verdict, one reason each (global errors of the report).
    reasons: list[str] = field(default_factory=list)


def judge_run(results: Path, summary: Path | None, found: same_run.ResultsRun) -> Judged:
    """The verdict on the run whose Allure results are ``results`` (its summary: ``summary``, else found beside
    them), or none and why."""
    path = find_summary(results, summary)
    if path is None:  # nothing judged the run: not judged (amber), and the build is no failure of it
        return _without(RunVerdict(NOT_JUDGED, f"no verdict: no JSON summary of this run (looked for "
                                               f"{results / SUMMARY_NAME} and beside it; --summary names one)"), None)
    try:
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return _without(RunVerdict(NO_VERDICT, f"{NO_VERDICT}: the summary {path} cannot be read ({exc})"), path)
    if doc.get("complete") is False:
        why = (f"the summary {path} is incomplete: run {doc.get('run_id') or '?'} was killed, interrupted or is still "
               "running")
        return _without(RunVerdict(NO_VERDICT, f"{NO_VERDICT}: {why}"), path, [why])
    differ = same_run.disagreements(doc, found)
    if differ:
        return _without(RunVerdict(NO_VERDICT, f"{NO_VERDICT}: the summary {path} is another run's"), path, differ)
    shown = verdict(doc, found.environment)
    if doc.get("run_id"):
        shown["run"] = str(doc["run_id"])
    return Judged(run_verdict(doc), shown, doc, path)


def _without(reached: RunVerdict, path: Path | None, reasons: list[str] | None = None) -> Judged:
    """A verdict reached without the run's own summary."""
    return Judged(reached, {"verdict": reached.headline}, None, path, reasons or [])
