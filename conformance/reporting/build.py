"""Build the offline single-file HTML report from Allure results: ``python -m conformance.reporting.build``.

    python -m conformance.reporting.build [--results reports/allure-results]
        [--out reports/allure-report] [--history reports/allure-history.jsonl | --no-history]
        [--summary FILE] [--baseline PATH] [--attach NAME=FILE ...]

One run, one verdict (:mod:`conformance.reporting.verdict_view`): from the
run's JSON summary, and only when the summary and the results are one run;
otherwise the report shows NO VERDICT and why, in red, and the command exits
2.  The verdict is the first thing the page shows
(:mod:`conformance.reporting.page`: a banner above Allure's app, coloured by
outcome, each level with its counts), then the report's variables repeat it,
the same table is a global attachment, and a verdict other than conformant is
a global error, as is every failure of the build itself.  The report is made
by npm's ``allure`` (:mod:`conformance.reporting.allure_cli`); the awesome
template's Google tag (hard-wired in Allure 3.x) is removed from the page.

The run is held to Allure 3's quality gate (:mod:`conformance.reporting.quality_gate`,
configured to match ``coc-gate``): its result, and why, is on the banner and
in the Quality Gates tab.  A gate that fails still leaves the report built,
and the command exits 1.  ``--baseline`` (a run's summary, a folder holding
one, Allure results, or an earlier report's ``allure-history.jsonl``) puts
the comparison ``coc-gate`` makes at the top of the page, before anything
else: per case and per check, what changed (:mod:`conformance.reporting.baseline`).
Fixture rows are left out (allure-pytest's containers).
Prints the report path, size, build time, the verdict and the gate; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.record.level_tally import CONFORMANT, NO_VERDICT
from conformance.reporting import allure_cli, page, quality_gate, same_run, verdict_view

DEFAULT_NAME = "CoC conformance"
DEFAULT_HISTORY_LIMIT = 30


@dataclass(frozen=True)
class BuiltReport:
    """A report built: where it is, what the run comes to, and what building it found."""

    report: str  #: the report's ``index.html``
    #: What the run comes to (:class:`~conformance.record.level_tally.RunVerdict`'s outcome).
    outcome: str
    size_bytes: int
    build_seconds: float
    tests: dict[str, int]
    history: str | None
    quality_gate: dict[str, object]
    #: The verdict's lines as the report shows them (``{"verdict": ..., "gate": ..., ...}``).
    verdict: dict[str, str] = field(default_factory=dict)
    #: What went wrong in the build itself (each is a global error of the report).
    problems: list[str] = field(default_factory=list)
    #: The comparison with ``--baseline``: ``{"source", "red", "sections": {title: cases}}``.
    baseline: dict[str, object] | None = None


def stage_results(results: Path, staged: Path, attachments: Mapping[str, str],
                  errors: list[dict[str, str]]) -> None:
    """The results as the report reads them: without fixture containers and the suite's summary, with the run's
    global attachments (name -> markdown) and errors."""
    staged.mkdir(parents=True, exist_ok=True)
    for path in results.iterdir():
        if path.is_file() and not path.name.endswith("-container.json") and \
                not path.name.startswith(verdict_view.SUMMARY_NAME):
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


def _baseline(given: Path, judged: verdict_view.Judged, found: same_run.ResultsRun) -> tuple[Any, list[str]]:
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
          history_limit: int = DEFAULT_HISTORY_LIMIT, tool_dir: Path = allure_cli.TOOL_DIR,
          summary: Path | None = None, extra: Mapping[str, str] | None = None,
          baseline: Path | None = None) -> BuiltReport:
    """Generate ``out/index.html`` from ``results``; appends this run to ``history``.

    ``extra``: more global attachments, name -> markdown (``--attach``: coc-gate's or coc-matrix's output);
    ``baseline``: a run to compare this one with, shown first.
    """
    results, out = results.resolve(), out.resolve()
    if not any(results.glob("*-result.json")):
        raise allure_cli.ReportBuildError(f"no Allure results in {results} (run pytest with --alluredir={results})")
    executable = allure_cli.ensure_cli(tool_dir)
    if history is not None:
        history = history.resolve()
        history.parent.mkdir(parents=True, exist_ok=True)
    allure_cli.prepare_output(out)
    start = time.perf_counter()
    found = same_run.read_results(results)
    judged = verdict_view.judge_run(results, summary, found)
    diff, problems = _baseline(baseline, judged, found) if baseline is not None else (None, [])
    problems = judged.reasons + problems
    with tempfile.TemporaryDirectory(prefix="coc-allurerc-") as tmp:
        collected = (judged.summary or {}).get("collected")
        gate = quality_gate.judge(executable, results, name, quality_gate.rules(collected), allure_cli.environment(),
                                  Path(tmp))
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
            attachments["verdict"] = verdict_view.verdict_markdown(shown, gate.summary, judged.summary)
        if judged.verdict.outcome != CONFORMANT:
            errors.append({"message": shown["verdict"], "trace": attachments.get("verdict", "")})
        errors.extend({"message": f"report build: {problem}"} for problem in problems)
        attachments.update(extra or {})
        staged = Path(tmp) / "results"
        stage_results(results, staged, attachments, errors)
        dump = Path(tmp) / "quality-gate.zip"
        quality_gate.write_dump(dump, quality_gate.report_entries(gate, found.statuses))
        config = allure_cli.allure_config(results, out, history, name, history_limit, shown)
        index = allure_cli.generate(executable, staged, dump, config, Path(tmp))
        top = page.banner(page.Banner(
            judged.verdict, verdict_view.level_rows(judged.summary) if judged.summary is not None else (),
            [(key, shown[key]) for key in ("gate", "implementation", "device", "run", "profile", "cases")
             if key in shown], gate.passed,
            [(cid, found.result_ids.get(cid)) for cid in verdict_view.not_judged_cases(judged.summary or {})],
            compared, problems))
        try:
            page.finish(index, top, page.tone(judged.verdict.outcome), gate.passed)
        except page.PageError as exc:
            raise allure_cli.ReportBuildError(str(exc)) from None
        seconds = time.perf_counter() - start
    stats_file = out / "summary.json"
    stats = json.loads(stats_file.read_text()).get("stats", {}) if stats_file.exists() else {}
    changes = None if diff is None else {
        "source": diff.baseline.source, "red": diff.red,
        "sections": {section.title: [row.case for row in section.rows] for section in diff.sections}}
    return BuiltReport(report=str(index), outcome=judged.verdict.outcome, size_bytes=index.stat().st_size,
                       build_seconds=round(seconds, 2), tests=stats, history=str(history) if history else None,
                       quality_gate=gate.as_dict(), verdict=shown, problems=problems, baseline=changes)


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
                        help=f"the run's JSON summary, for the verdict (default: {verdict_view.SUMMARY_NAME} inside "
                             "--results, else beside it); a summary of another run gives no verdict (exit 2)")
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
                raise allure_cli.ReportBuildError(f"--attach {given!r}: expected NAME=FILE naming an existing file")
            extra[label] = Path(file).read_text(encoding="utf-8")
        built = build(args.results, args.out, None if args.no_history else args.history, name=args.name,
                      history_limit=args.history_limit, summary=args.summary, extra=extra, baseline=args.baseline)
    except allure_cli.ReportBuildError as exc:
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
