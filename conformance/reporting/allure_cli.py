"""npm's ``allure`` command line (Allure 3): installed, configured and run.

The command line is pinned in ``conformance/reporting/npm/package.json`` (with
its lock file) and installed there by ``npm ci`` on first use.  It is 3.14: the
quality gate of 3.15 and later calls iterator helpers that need Node 22, and
Debian's Node is 20 (the gate then fails on every run).  The report is one
``index.html`` (the *awesome* plugin in ``singleFile`` mode) that opens from
disk without a server or network.  Each build appends the run to the history
file, which feeds the report's trend.  Analytics are off: the environment
switch where Allure honours one.  The "success rate" chart (it paints skipped
and not-judged cases red) and the Charts page's copy of the overview's status
ring are left out of the charts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

TOOL_DIR = Path(__file__).with_name("npm")

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


def environment() -> dict[str, str]:
    """The environment every ``allure`` command runs in: this one, analytics off."""
    return {**os.environ, "ALLURE_NO_ANALYTICS": "true"}


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


def prepare_output(out: Path) -> None:
    """Empty ``out`` if it holds a previous report; refuse to clear anything else."""
    if out.exists():
        if any(out.iterdir()) and not (out / "index.html").exists():
            raise ReportBuildError(f"{out} exists and is not a report directory; not clearing it")
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)


def generate(executable: Path, staged: Path, dump: Path, config: Mapping[str, object], workdir: Path) -> Path:
    """``allure generate`` of the staged results, with the quality gate's ``dump``, as ``config`` says (its
    ``output``, written in ``workdir``); the report's ``index.html``."""
    config_file = workdir / "allurerc.json"
    config_file.write_text(json.dumps(config))
    out = Path(str(config["output"]))
    done = subprocess.run(
        [str(executable), "generate", str(staged), "--dump", str(dump), "--config", str(config_file),
         "--output", str(out)],
        capture_output=True, text=True, env=environment(), cwd=workdir,
    )
    index = out / "index.html"
    if done.returncode != 0 or not index.exists():
        raise ReportBuildError(f"allure generate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return index
