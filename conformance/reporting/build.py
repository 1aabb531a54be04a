"""Build the offline single-file HTML report from Allure results (npm's ``allure``, Allure 3).

    python -m conformance.reporting.build [--results reports/allure-results]
        [--out reports/allure-report] [--history reports/allure-history.jsonl | --no-history]
        [--summary FILE] [--baseline PATH] [--attach NAME=FILE ...]

The Allure command line is pinned in ``conformance/reporting/npm/package.json`` (with
its lock file) and installed there by ``npm ci`` on first use.  It is 3.14: the
quality gate of 3.15 and later calls iterator helpers that need Node 22, and
Debian's Node is 20 (the gate then fails on every run).  The report is
one ``index.html`` (the *awesome* plugin in ``singleFile`` mode) that opens
from disk without a server or network.  Each build appends the run to the
history file, which feeds the report's trend.  Analytics are off: the
environment switch where Allure honours one, and the awesome template's
Google tag (hard-wired in Allure 3.x) is removed from the page.

One run, one verdict: the verdict comes from the run's JSON summary
(``--summary``, default ``coc-summary.json`` inside the results folder, where
the suite writes it, else beside it), and only when the summary and the
results are one run (:mod:`conformance.reporting.same_run`: the run id both
carry, and the implementation); otherwise the report shows NO VERDICT and
why, in red, and the command exits 2.  The verdict is counted by
:mod:`conformance.record.level_tally`, the terminal's own function: a level
with no check judged is *not judged*, never conformant.  The build keys on
the verdict's outcome as the record states it (:class:`~conformance.record.level_tally.RunVerdict`),
never on its text.  It is the first
thing the page shows (:mod:`conformance.reporting.page`: a banner above
Allure's app, coloured by outcome, each level with its counts), then the
report's variables repeat it, the same table is a global attachment, and a
verdict other than conformant is a global error, as is every failure of the
build itself.

The run is held to Allure 3's quality gate (:mod:`conformance.reporting.quality_gate`,
configured to match ``coc-gate``): its result, and why, is on the banner and
in the Quality Gates tab.  A gate that fails still leaves the report built,
and the command exits 1.  ``--baseline`` (a run's summary, a folder holding
one, Allure results, or an earlier report's ``allure-history.jsonl``) puts
the comparison ``coc-gate`` makes at the top of the page, before anything
else: per case and per check, what changed (:mod:`conformance.reporting.baseline`).

Fixture rows are left out (allure-pytest's containers); the "success rate"
chart (it paints skipped and not-judged cases red) and the Charts page's
copy of the overview's status ring are left out of the charts.
Prints the report path, size, build time, the verdict and the gate; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.record.level_tally import CONFORMANT, NO_VERDICT, NOT_JUDGED, RunVerdict
from conformance.reporting import page, quality_gate, same_run

TOOL_DIR = Path(__file__).with_name("npm")
DEFAULT_NAME = "CoC conformance"
DEFAULT_HISTORY_LIMIT = 30
#: The suite's summary of a run, inside its results folder (written there by default) or beside it.
SUMMARY_NAME = "coc-summary.json"
#: Allure 3.14's default charts, less the success-rate map (it paints a skipped or not-judged case red) and
#: the status ring (the overview shows it; on the Charts page it logs a negative SVG width before it is laid out).
CHARTS: list[dict[str, object]] = [
    {"type": "statusDynamics", "title": "Status dynamics"},
    {"type": "trSeverities", "title": "Test results by severities",
     "levels": ["blocker", "critical", "normal", "minor", "trivial"],
     "statuses": ["passed", "failed", "broken", "skipped", "unknown"], "includeUnset": True},
    {"type": "statusTransitions", "title": "Status transitions"},
    {"type": "testBaseGrowthDynamics", "title": "Test base growth dynamics"},
    {"type": "coverageDiff", "title": "Coverage diff map"},
    {"type": "problemsDistribution", "by": "environment", "title": "Problems distribution by environment"},
    *(dict[str, object](type="stabilityDistribution", title=f"Stability distribution by {by}s",
                        skipStatuses=["skipped", "unknown"], threshold=90, groupBy=by)
      for by in ("feature", "epic", "story")),
    {"type": "durations", "title": "Durations histogram", "groupBy": "none"},
    {"type": "durationDynamics", "title": "Durations dynamics"},
    {"type": "statusAgePyramid", "title": "Status age pyramid"},
]
class ReportBuildError(RuntimeError):
    """npm or Allure is missing or failed; the message says which and why."""


@dataclass(frozen=True)
class BuiltReport:
    report: str
    size_bytes: int
    build_seconds: float
    tests: dict[str, int]
    history: str | None
    quality_gate: dict[str, object]
    verdict: dict[str, str] = field(default_factory=dict)
    #: What went wrong in the build itself (each is a global error of the report).
    problems: list[str] = field(default_factory=list)
    #: The comparison with ``--baseline``: ``{"source", "red", "sections": {title: cases}}``.
    baseline: dict[str, object] | None = None
    #: What the run comes to (:class:`~conformance.record.level_tally.RunVerdict`'s outcome).
    outcome: str = NO_VERDICT


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


def stage_results(results: Path, staged: Path, attachments: Mapping[str, str],
                  errors: list[dict[str, str]]) -> None:
    """The results as the report reads them: without fixture containers and the suite's summary, with the run's
    global attachments (name -> markdown) and errors."""
    staged.mkdir(parents=True, exist_ok=True)
    for path in results.iterdir():
        if path.is_file() and not path.name.endswith("-container.json") and \
                not path.name.startswith(SUMMARY_NAME):
            try:  # Allure's reader skips symbolic links
                os.link(path, staged / path.name)
            except OSError:
                shutil.copyfile(path, staged / path.name)
    files = []
    for i, (name, body) in enumerate(attachments.items()):
        source = f"coc-global-{i}-attachment.md"
        (staged / source).write_text(body, encoding="utf-8")
        files.append({"name": name, "source": source, "type": "text/markdown"})
    (staged / "coc-run-globals.json").write_text(json.dumps({"attachments": files, "errors": errors}))


def pinned_version(tool_dir: Path = TOOL_DIR) -> str:
    return json.loads((tool_dir / "package.json").read_text())["dependencies"]["allure"]


def ensure_cli(tool_dir: Path = TOOL_DIR) -> Path:
    """The pinned ``allure`` executable, installed with ``npm ci`` if absent or outdated."""
    from filelock import FileLock

    executable = tool_dir / "node_modules" / ".bin" / "allure"
    installed = tool_dir / "node_modules" / "allure" / "package.json"
    key = hashlib.sha256(str(tool_dir.resolve()).encode()).hexdigest()[:16]
    with FileLock(Path(tempfile.gettempdir()) / f"coc-allure-npm-{key}.lock"):
        if executable.exists() and installed.exists() and \
                json.loads(installed.read_text())["version"] == pinned_version(tool_dir):
            return executable
        npm = shutil.which("npm")
        if npm is None:
            raise ReportBuildError("npm is not installed: the report is built with npm's `allure` package "
                                   "(install Node.js 18+ with npm)")
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=tool_dir,
                              capture_output=True, text=True)
        if done.returncode != 0 or not executable.exists():
            raise ReportBuildError(f"`npm ci` in {tool_dir} failed:\n{done.stdout}\n{done.stderr}")
    return executable


def allure_config(results: Path, out: Path, history: Path | None, name: str,
                  history_limit: int, variables: Mapping[str, str] | None = None) -> dict[str, object]:
    """Allure 3 configuration: single-file awesome report, history, the run's categories, the charts that say
    what they show, the build's own labels hidden."""
    from conformance.record.report_properties import CASE_LABEL, RUN_LABEL

    categories_file = results / "categories.json"
    if categories_file.exists():
        categories = json.loads(categories_file.read_text())
    else:
        from conformance.reporting.meta import categories as default_categories

        categories = default_categories()
    config: dict[str, object] = {
        "name": name,
        "output": str(out),
        "categories": categories,
        "hideLabels": [RUN_LABEL, CASE_LABEL],
        "plugins": {"awesome": {"options": {
            "singleFile": True, "reportName": name, "groupBy": ["epic", "feature", "story"], "charts": CHARTS,
        }}},
    }
    if history is not None:
        config.update(historyPath=str(history), appendHistory=True, historyLimit=history_limit)
    if variables:
        config["variables"] = dict(variables)
    return config


def _prepare_output(out: Path) -> None:
    """Empty ``out`` if it holds a previous report; refuse to clear anything else."""
    if out.exists():
        if any(out.iterdir()) and not (out / "index.html").exists():
            raise ReportBuildError(f"{out} exists and is not a report directory; not clearing it")
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)


@dataclass
class _Judged:
    """The verdict the build reached: what the variables, the banner and the global errors say."""

    verdict: RunVerdict
    shown: dict[str, str]
    summary: Mapping[str, Any] | None  # the run's own summary; None when there is none or it is another run's
    summary_path: Path | None
    #: Why there is no verdict, one reason each (global errors of the report).
    reasons: list[str] = field(default_factory=list)


def _judge(results: Path, summary: Path | None, found: same_run.ResultsRun) -> _Judged:
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
    return _Judged(run_verdict(doc), shown, doc, path)


def _without(reached: RunVerdict, path: Path | None, reasons: list[str] | None = None) -> _Judged:
    """A verdict reached without the run's own summary."""
    return _Judged(reached, {"verdict": reached.headline}, None, path, reasons or [])


def _baseline(given: Path, judged: _Judged, found: same_run.ResultsRun) -> tuple[Any, list[str]]:
    """The comparison with ``given`` (None, and why, when there is none)."""
    from conformance.record.run_diff import diff_runs
    from conformance.record.runs import RunError, load_run
    from conformance.reporting import baseline

    if judged.summary_path is None or judged.summary is None:
        return None, [f"no baseline view: the comparison with {given} needs this run's summary"]
    try:
        return diff_runs(baseline.load(given, found.cases_by_title), load_run(judged.summary_path)), []
    except RunError as exc:
        return None, [f"no baseline view: {exc}"]


def build(results: Path, out: Path, history: Path | None = None, *, name: str = DEFAULT_NAME,
          history_limit: int = DEFAULT_HISTORY_LIMIT, tool_dir: Path = TOOL_DIR,
          summary: Path | None = None, extra: Mapping[str, str] | None = None,
          baseline: Path | None = None) -> BuiltReport:
    """Generate ``out/index.html`` from ``results``; appends this run to ``history``.

    ``extra``: more global attachments, name -> markdown (``--attach``: coc-gate's or coc-matrix's output);
    ``baseline``: a run to compare this one with, shown first.
    """
    results, out = results.resolve(), out.resolve()
    if not any(results.glob("*-result.json")):
        raise ReportBuildError(f"no Allure results in {results} (run pytest with --alluredir={results})")
    executable = ensure_cli(tool_dir)
    if history is not None:
        history = history.resolve()
        history.parent.mkdir(parents=True, exist_ok=True)
    _prepare_output(out)
    start = time.perf_counter()
    env = {**os.environ, "ALLURE_NO_ANALYTICS": "true"}
    found = same_run.read_results(results)
    judged = _judge(results, summary, found)
    diff, problems = _baseline(baseline, judged, found) if baseline is not None else (None, [])
    problems = judged.reasons + problems
    with tempfile.TemporaryDirectory(prefix="coc-allurerc-") as tmp:
        collected = (judged.summary or {}).get("collected")
        gate = quality_gate.judge(executable, results, name, quality_gate.rules(collected), env, Path(tmp))
        shown = judged.shown
        at = [key for key in shown if key not in ("implementation", "device", "profile", "cases", "run")]
        shown = {**{k: shown[k] for k in at}, "gate": gate.summary, **{k: v for k, v in shown.items() if k not in at}}
        compared = ""
        if diff is not None:
            from conformance.reporting import baseline as baseline_view

            shown["baseline"] = f"{diff.baseline.source}: {baseline_view.summary_line(diff)}"
            compared = baseline_view.view(diff, found.result_ids)
        attachments: dict[str, str] = {}
        errors: list[dict[str, str]] = []
        if judged.summary is not None:
            attachments["verdict"] = verdict_markdown(shown, gate.summary, judged.summary)
        if judged.verdict.outcome != CONFORMANT:
            errors.append({"message": shown["verdict"], "trace": attachments.get("verdict", "")})
        errors.extend({"message": f"report build: {problem}"} for problem in problems)
        attachments.update(extra or {})
        staged = Path(tmp) / "results"
        stage_results(results, staged, attachments, errors)
        dump = Path(tmp) / "quality-gate.zip"
        quality_gate.write_dump(dump, quality_gate.report_entries(gate, found.statuses))
        config_file = Path(tmp) / "allurerc.json"
        config_file.write_text(json.dumps(allure_config(results, out, history, name, history_limit, shown)))
        done = subprocess.run(
            [str(executable), "generate", str(staged), "--dump", str(dump), "--config", str(config_file),
             "--output", str(out)],
            capture_output=True, text=True, env=env, cwd=tmp,
        )
        index = out / "index.html"
        if done.returncode != 0 or not index.exists():
            raise ReportBuildError(f"allure generate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        top = page.banner(page.Banner(
            judged.verdict, level_rows(judged.summary) if judged.summary is not None else (),
            [(key, shown[key]) for key in ("gate", "implementation", "device", "run", "profile", "cases")
             if key in shown], gate.passed,
            [(cid, found.result_ids.get(cid)) for cid in not_judged_cases(judged.summary or {})],
            compared, problems))
        try:
            page.finish(index, top, page.tone(judged.verdict.outcome), gate.passed)
        except page.PageError as exc:
            raise ReportBuildError(str(exc)) from None
        seconds = time.perf_counter() - start
    stats_file = out / "summary.json"
    stats = json.loads(stats_file.read_text()).get("stats", {}) if stats_file.exists() else {}
    changes = None if diff is None else {
        "source": diff.baseline.source, "red": diff.red,
        "sections": {section.title: [row.case for row in section.rows] for section in diff.sections}}
    return BuiltReport(str(index), index.stat().st_size, round(seconds, 2), stats,
                       str(history) if history else None, gate.as_dict(), shown, problems, changes,
                       judged.verdict.outcome)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance.reporting.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("reports/allure-results"))
    parser.add_argument("--out", type=Path, default=Path("reports/allure-report"))
    parser.add_argument("--history", type=Path, default=Path("reports/allure-history.jsonl"),
                        help="JSON-lines history kept between runs, for the trend (default: %(default)s)")
    parser.add_argument("--no-history", action="store_true", help="neither read nor append history")
    parser.add_argument("--history-limit", type=int, default=DEFAULT_HISTORY_LIMIT)
    parser.add_argument("--name", default=DEFAULT_NAME)
    parser.add_argument("--summary", type=Path, default=None,
                        help=f"the run's JSON summary, for the verdict (default: {SUMMARY_NAME} inside --results, "
                             "else beside it); a summary of another run gives no verdict (exit 2)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="PATH",
                        help="an earlier run to compare this one with, shown first: its coc-summary.json (or a "
                             "folder holding one, or its Allure results) or an earlier report's history (.jsonl: "
                             "its last run)")
    parser.add_argument("--attach", action="append", default=[], metavar="NAME=FILE",
                        help="a markdown file shown among the report's global attachments (coc-gate's or "
                             "coc-matrix's --out); repeatable")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    try:
        extra = {}
        for given in args.attach:
            label, sep, file = given.partition("=")
            if not sep or not Path(file).is_file():
                raise ReportBuildError(f"--attach {given!r}: expected NAME=FILE naming an existing file")
            extra[label] = Path(file).read_text(encoding="utf-8")
        built = build(args.results, args.out, None if args.no_history else args.history, name=args.name,
                      history_limit=args.history_limit, summary=args.summary, extra=extra, baseline=args.baseline)
    except ReportBuildError as exc:
        print(f"report_build: {exc}", file=sys.stderr)
        return 1
    print(f"report: {built.report}")
    print(f"size: {built.size_bytes / 1e6:.2f} MB, build: {built.build_seconds:.1f} s, tests: {built.tests}")
    print(f"verdict: {built.verdict['verdict']}")
    for problem in built.problems:
        print(f"report build: {problem}", file=sys.stderr)
    gate = built.quality_gate
    print(f"quality gate: {'passed' if gate['passed'] else 'FAILED'} {gate['rules']}"
          + ("" if gate["passed"] else f"\n{gate['output']}"))
    print(json.dumps(asdict(built)))
    if built.outcome == NO_VERDICT:
        return 2
    return 0 if gate["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
