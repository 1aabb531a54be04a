"""Build the offline single-file HTML report from Allure results (npm's ``allure``, Allure 3).

    python -m conformance.reporting.build [--results reports/allure-results]
        [--out reports/allure-report] [--history reports/allure-history.jsonl | --no-history]

The Allure command line is pinned in ``conformance/reporting/npm/package.json`` (with
its lock file) and installed there by ``npm ci`` on first use.  It is 3.14: the
quality gate of 3.15 and later calls iterator helpers that need Node 22, and
Debian's Node is 20 (the gate then fails on every run).  The report is
one ``index.html`` (the *awesome* plugin in ``singleFile`` mode) that opens
from disk without a server or network.  Each build appends the run to the
history file, which feeds the report's trend.  Analytics are off: the
environment switch where Allure honours one, and the awesome template's
Google tag (hard-wired in Allure 3.x) is removed from the page.

The run is also held to Allure 3's quality gate, configured to match
``coc-gate``: no failed or broken case (known failures are
reported by the suite as expected failures, which Allure counts as skipped),
and -- when the suite's ``coc-summary.json`` sits next to the results -- no
fewer results than cases collected (a crashed worker's lost cases show).  A
gate that fails still leaves the report built, and the command exits 1.

The verdict comes first: from the suite's JSON summary (``--summary``,
default next to the results) the report's variables -- the first thing the
overview shows -- say whether the implementation is conformant at the levels
that gate, the per-level table the terminal printed (counted by
:mod:`conformance.judge.level_tally`, the terminal's own function), the
gate's result, and the implementation, device and profile; the same table is
a global attachment, and a failed verdict a global error.  Allure 3.14 fills
its Quality Gates tab only for runs made through ``allure run``, so the gate's
result is written where the report shows it.  Fixture rows are left out
(allure-pytest's containers), and descriptions are given a height, which
their frame cannot measure when the report is opened from disk.
Prints the report path, size, build time and the gate; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TOOL_DIR = Path(__file__).with_name("npm")
DEFAULT_NAME = "CoC conformance"
DEFAULT_HISTORY_LIMIT = 30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ANALYTICS = re.compile(
    r"\s*<script async src=\"https://www\.googletagmanager\.com/[^\"]*\"></script>"
    r"\s*<script>[^<]*gtag\([^<]*</script>")


class ReportBuildError(RuntimeError):
    """npm or Allure is missing or failed; the message says which and why."""


#: Descriptions get a height in place of the one their frame measures (0 when the report is opened
#: from disk); the verdict's variables are shown whole, one a line (Allure cuts each to a chip's width).
_STYLE = ('<style>[data-testid="test-result-description-frame"]{min-height:12em;resize:vertical}'
          '[data-testid="report-variables"] [data-testid="metadata-list"]{grid-template-columns:100%!important}'
          '[data-testid="report-variables"] [data-testid="metadata-item-value"] *'
          "{white-space:normal!important;overflow:visible!important;max-width:none!important}</style>")


@dataclass(frozen=True)
class BuiltReport:
    report: str
    size_bytes: int
    build_seconds: float
    tests: dict[str, int]
    history: str | None
    quality_gate: dict[str, object]
    verdict: dict[str, str] = field(default_factory=dict)


def _summary_of(results: Path, summary: Path | None) -> dict[str, Any] | None:
    path = summary if summary is not None else results.parent / "coc-summary.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def verdict(summary: Mapping[str, Any], environment: Mapping[str, str]) -> dict[str, str]:
    """What a reviewer decides from, in the order the overview shows it.

    ``verdict``: conformant or not at the levels the run's gate holds; one
    entry per level, the terminal's line for it; ``cases``: every outcome the
    summary counts (any outcome other than passed is shown by its name, never
    as passed); then the implementation, device and profile.
    """
    from conformance.judge import level_tally
    from conformance.judge.levels import Level
    from conformance.report_properties import GATE_ENFORCED, GATE_NOT_RUN

    gate = Level.parse_many(str(summary.get("gate") or "all"))
    cases = summary.get("cases", [])
    counts = level_tally.tally((check for case in cases for check in case.get("checks", ())), gate)
    outcomes: Mapping[str, int] = summary.get("outcomes", {})
    failed, errors = outcomes.get("failed", 0), outcomes.get("error", 0)
    missing = len(summary.get("missing", []))
    levels = ", ".join(level.value for level in Level if level in gate)
    if errors:
        headline = f"NOT DECIDED at {levels}: {errors} case(s) hit an error of the suite itself"
    elif failed or missing:
        lost = f", {missing} collected case(s) without a result" if missing else ""
        headline = f"NOT CONFORMANT at {levels}: {failed} case(s) failed a gated check{lost}"
    else:
        headline = f"CONFORMANT at {levels}"
    shown = {"verdict": headline}
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
    from conformance.judge import level_tally
    from conformance.judge.levels import Level

    gate = Level.parse_many(str(summary.get("gate") or "all"))
    counts = level_tally.tally((c for case in summary.get("cases", []) for c in case.get("checks", ())), gate)
    failed = [f"- `{case['nodeid']}`: " + "; ".join(f"[{c['level']}] {c['name']}" for c in case.get("checks", ())
                                                   if level_tally.column(c, gate) == "failed")
              for case in summary.get("cases", []) if case.get("outcome") in ("failed", "error")]
    return "\n".join([
        f"# {shown['verdict']}", "", "Requirement levels (checks), as the terminal printed them:", "", "```",
        *level_tally.lines(counts, gate), "```", "", f"Gate: {gate_result}", "",
        *(f"- {key}: {value}" for key, value in shown.items() if key in ("cases", "implementation", "device",
                                                                         "profile")),
        *(["", "Failed cases and their failed gated checks:", "", *failed[:200]] if failed else []), ""])


def read_environment(results: Path) -> dict[str, str]:
    """``environment.properties`` as written by the suite (keys and values unescaped)."""
    path = results / "environment.properties"
    if not path.is_file():
        return {}
    pairs = (re.split(r"(?<!\\)=", line, maxsplit=1) for line in path.read_text(encoding="utf-8").splitlines())
    return {key.replace("\\", ""): value.replace("\\n", "\n") for key, value in
            (pair for pair in pairs if len(pair) == 2)}


def stage_results(results: Path, staged: Path, attachments: Mapping[str, str],
                  errors: list[dict[str, str]]) -> None:
    """The results as the report reads them: without fixture containers, with the run's global
    attachments (name -> markdown) and errors."""
    staged.mkdir(parents=True, exist_ok=True)
    for path in results.iterdir():
        if path.is_file() and not path.name.endswith("-container.json"):
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


def quality_gate_rules(results: Path) -> list[dict[str, object]]:
    """No failure; and at least as many results as the suite collected, when its summary is there."""
    rule: dict[str, object] = {"id": "coc-conformance", "maxFailures": 0}
    summary = results.parent / "coc-summary.json"
    if summary.exists():
        collected = json.loads(summary.read_text()).get("collected")
        if collected:
            rule["minTestsCount"] = int(collected)
    return [rule]


def allure_config(results: Path, out: Path, history: Path | None, name: str,
                  history_limit: int, variables: Mapping[str, str] | None = None) -> dict[str, object]:
    """Allure 3 configuration: single-file awesome report, history, the run's categories."""
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
        "plugins": {"awesome": {"options": {
            "singleFile": True, "reportName": name, "groupBy": ["epic", "feature", "story"],
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


def strip_analytics(index: Path) -> None:
    html = index.read_text(encoding="utf-8")
    stripped = _ANALYTICS.sub("", html)
    if "googletagmanager" in stripped:
        raise ReportBuildError(f"{index}: the analytics tag changed shape; update report_build._ANALYTICS")
    stripped = stripped.replace("</head>", _STYLE + "</head>", 1)
    if stripped != html:
        index.write_text(stripped, encoding="utf-8")


def _quality_gate(executable: Path, results: Path, name: str, env: Mapping[str, str], tmp: Path) -> dict[str, Any]:
    """Allure's quality gate on the results; it reads its own configuration (rules only): given the
    report's, it would append the run to the history a second time."""
    gate_file = tmp / "qualitygate.json"
    rules = quality_gate_rules(results)
    gate_file.write_text(json.dumps({"name": name, "qualityGate": {"rules": rules}}))
    gate = subprocess.run([str(executable), "quality-gate", str(results), "--config", str(gate_file)],
                          capture_output=True, text=True, env=dict(env), cwd=tmp)
    said = _ANSI.sub("", gate.stdout + gate.stderr).strip()
    return {"passed": gate.returncode == 0, "rules": rules, "output": said[-2000:]}


def build(results: Path, out: Path, history: Path | None = None, *, name: str = DEFAULT_NAME,
          history_limit: int = DEFAULT_HISTORY_LIMIT, tool_dir: Path = TOOL_DIR,
          summary: Path | None = None, extra: Mapping[str, str] | None = None) -> BuiltReport:
    """Generate ``out/index.html`` from ``results``; appends this run to ``history``.

    ``extra``: more global attachments, name -> markdown (``--attach``: coc-gate's or coc-matrix's output).
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
    with tempfile.TemporaryDirectory(prefix="coc-allurerc-") as tmp:
        gate = _quality_gate(executable, results, name, env, Path(tmp))
        said = str(gate["output"]).splitlines() or ["see the build log"]
        gate_result = "passed" if gate["passed"] else f"FAILED ({said[-1][:200]})"
        run = _summary_of(results, summary)
        shown = verdict(run, read_environment(results)) if run is not None else {}
        attachments: dict[str, str] = {}
        errors: list[dict[str, str]] = []
        if shown:
            at = [key for key in shown if key not in ("implementation", "device", "profile", "cases")]
            shown = {**{k: shown[k] for k in at}, "gate": gate_result,
                     **{k: v for k, v in shown.items() if k not in at}}
            attachments["verdict"] = verdict_markdown(shown, gate_result, run or {})
            if not shown["verdict"].startswith("CONFORMANT"):
                errors.append({"message": shown["verdict"], "trace": attachments["verdict"]})
        attachments.update(extra or {})
        staged = Path(tmp) / "results"
        stage_results(results, staged, attachments, errors)
        config_file = Path(tmp) / "allurerc.json"
        config_file.write_text(json.dumps(allure_config(results, out, history, name, history_limit, shown)))
        done = subprocess.run(
            [str(executable), "generate", str(staged), "--config", str(config_file), "--output", str(out)],
            capture_output=True, text=True, env=env, cwd=tmp,
        )
        index = out / "index.html"
        if done.returncode != 0 or not index.exists():
            raise ReportBuildError(f"allure generate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        strip_analytics(index)
        seconds = time.perf_counter() - start
    stats_file = out / "summary.json"
    stats = json.loads(stats_file.read_text()).get("stats", {}) if stats_file.exists() else {}
    return BuiltReport(str(index), index.stat().st_size, round(seconds, 2), stats,
                       str(history) if history else None, gate, shown)


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
                        help="the suite's JSON summary, for the verdict (default: coc-summary.json next to --results)")
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
                      history_limit=args.history_limit, summary=args.summary, extra=extra)
    except ReportBuildError as exc:
        print(f"report_build: {exc}", file=sys.stderr)
        return 1
    print(f"report: {built.report}")
    print(f"size: {built.size_bytes / 1e6:.2f} MB, build: {built.build_seconds:.1f} s, tests: {built.tests}")
    if built.verdict:
        print(f"verdict: {built.verdict['verdict']}")
    gate = built.quality_gate
    print(f"quality gate: {'passed' if gate['passed'] else 'FAILED'} {gate['rules']}"
          + ("" if gate["passed"] else f"\n{gate['output']}"))
    print(json.dumps(asdict(built)))
    return 0 if gate["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
