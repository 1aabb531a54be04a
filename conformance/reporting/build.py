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
from dataclasses import asdict, dataclass
from pathlib import Path

TOOL_DIR = Path(__file__).with_name("npm")
DEFAULT_NAME = "CoC conformance"
DEFAULT_HISTORY_LIMIT = 30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ANALYTICS = re.compile(
    r"\s*<script async src=\"https://www\.googletagmanager\.com/[^\"]*\"></script>"
    r"\s*<script>[^<]*gtag\([^<]*</script>")


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
                  history_limit: int) -> dict[str, object]:
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
    if stripped != html:
        index.write_text(stripped, encoding="utf-8")


def build(results: Path, out: Path, history: Path | None = None, *, name: str = DEFAULT_NAME,
          history_limit: int = DEFAULT_HISTORY_LIMIT, tool_dir: Path = TOOL_DIR) -> BuiltReport:
    """Generate ``out/index.html`` from ``results``; appends this run to ``history``."""
    results, out = results.resolve(), out.resolve()
    if not any(results.glob("*-result.json")):
        raise ReportBuildError(f"no Allure results in {results} (run pytest with --alluredir={results})")
    executable = ensure_cli(tool_dir)
    if history is not None:
        history = history.resolve()
        history.parent.mkdir(parents=True, exist_ok=True)
    _prepare_output(out)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coc-allurerc-") as tmp:
        config_file = Path(tmp) / "allurerc.json"
        config_file.write_text(json.dumps(allure_config(results, out, history, name, history_limit)))
        env = {**os.environ, "ALLURE_NO_ANALYTICS": "true"}
        done = subprocess.run(
            [str(executable), "generate", str(results), "--config", str(config_file), "--output", str(out)],
            capture_output=True, text=True, env=env,
        )
        index = out / "index.html"
        if done.returncode != 0 or not index.exists():
            raise ReportBuildError(f"allure generate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        strip_analytics(index)
        seconds = time.perf_counter() - start
        # The gate reads its own configuration (rules only): given the report's, it
        # would append the run to the history a second time.
        gate_file = Path(tmp) / "qualitygate.json"
        rules = quality_gate_rules(results)
        gate_file.write_text(json.dumps({"name": name, "qualityGate": {"rules": rules}}))
        gate = subprocess.run([str(executable), "quality-gate", str(results), "--config", str(gate_file)],
                              capture_output=True, text=True, env=env, cwd=tmp)
    summary = out / "summary.json"
    stats = json.loads(summary.read_text()).get("stats", {}) if summary.exists() else {}
    said = _ANSI.sub("", gate.stdout + gate.stderr).strip()
    return BuiltReport(str(index), index.stat().st_size, round(seconds, 2), stats,
                       str(history) if history else None,
                       {"passed": gate.returncode == 0, "rules": rules, "output": said[-2000:]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.reporting.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("reports/allure-results"))
    parser.add_argument("--out", type=Path, default=Path("reports/allure-report"))
    parser.add_argument("--history", type=Path, default=Path("reports/allure-history.jsonl"),
                        help="JSON-lines history kept between runs, for the trend (default: %(default)s)")
    parser.add_argument("--no-history", action="store_true", help="neither read nor append history")
    parser.add_argument("--history-limit", type=int, default=DEFAULT_HISTORY_LIMIT)
    parser.add_argument("--name", default=DEFAULT_NAME)
    args = parser.parse_args(argv)
    try:
        built = build(args.results, args.out, None if args.no_history else args.history, name=args.name,
                      history_limit=args.history_limit)
    except ReportBuildError as exc:
        print(f"report_build: {exc}", file=sys.stderr)
        return 1
    print(f"report: {built.report}")
    print(f"size: {built.size_bytes / 1e6:.2f} MB, build: {built.build_seconds:.1f} s, tests: {built.tests}")
    gate = built.quality_gate
    print(f"quality gate: {'passed' if gate['passed'] else 'FAILED'} {gate['rules']}"
          + ("" if gate["passed"] else f"\n{gate['output']}"))
    print(json.dumps(asdict(built)))
    return 0 if gate["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
