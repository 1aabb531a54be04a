"""The built report, opened in a real browser (headless Chromium), shows the run's totals.

The suite's configuration cases run against a faulty implementation
(environment beats command line: exactly one case fails), the offline
report is built twice with one history file (the quality gate fails both
builds on that case, and the report is built all the same), and Chromium
renders it from disk.  The screenshot is kept in ``reports/browser/report-summary.png``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conformance.reporting import build as report_build
from tests.support import ROOT

ARTEFACT = ROOT / "reports" / "browser" / "report-summary.png"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
_CLI = report_build.TOOL_DIR / "node_modules" / ".bin" / "allure"

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt install chromium)"),
    pytest.mark.skipif(shutil.which("npm") is None and not _CLI.exists(),
                       reason="npm is not installed: the report is built with npm's `allure`"),
]


class SummaryCounts(HTMLParser):
    """Reads the report's summary counters: ``data-testid="metadata-item-<status>"``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self._stack: list[str | None] = []  # the metadata item each open element belongs to

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        testid = dict(attrs).get("data-testid") or ""
        parent = self._stack[-1] if self._stack else None
        self._stack.append(testid.removeprefix("metadata-item-") if testid.startswith("metadata-item-")
                           else parent)

    def handle_endtag(self, tag: str) -> None:
        if self._stack:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        item = self._stack[-1] if self._stack else None
        if item and data.strip().isdigit() and item not in self.counts:
            self.counts[item] = int(data.strip())


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args],
        capture_output=True, text=True, timeout=180, check=True,
    )


def _build(results: Path, out: Path, history: Path) -> dict[str, object]:
    """The README's one command, in a subprocess (the first build may run ``npm ci``)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "conformance.reporting.build", "--results", str(results), "--out", str(out),
         "--history", str(history)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": path},
    )
    built: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    gate = built["quality_gate"]
    assert isinstance(gate, dict)
    # The run holds one failure: the report is built, and the gate fails it on the failure rule.
    assert done.returncode == 1 and not gate["passed"] and "maxFailures" in gate["output"], done.stdout + done.stderr
    return built


def test_report_in_browser_shows_totals(run_suite: Callable[..., object], tmp_path: Path) -> None:
    results, history = tmp_path / "allure-results", tmp_path / "allure-history.jsonl"
    run = run_suite("test_config", "tests.support.faulty_impls:EnvBeatsCommandLine", "-k", "effective_config",
                    f"--alluredir={results}")
    assert len(run.failed) == 1 and run.passed == 11, run.output  # type: ignore[attr-defined]

    first = _build(results, tmp_path / "report-1", history)
    built = _build(results, tmp_path / "report", history)
    assert first["tests"] == {"total": 12, "new": 12, "passed": 11, "failed": 1}
    assert built["tests"] == {"total": 12, "passed": 11, "failed": 1}  # none new: history ids held
    assert len(history.read_text().splitlines()) == 2
    page = Path(str(built["report"]))
    assert "googletagmanager" not in page.read_text(encoding="utf-8")

    url = page.as_uri()
    dom = _chromium(tmp_path / "profile-dom", "--dump-dom", url).stdout
    parser = SummaryCounts()
    parser.feed(dom)
    assert parser.counts.get("total") == 12 and parser.counts.get("passed") == 11 \
        and parser.counts.get("failed") == 1, parser.counts

    screenshot = tmp_path / "report-summary.png"
    _chromium(tmp_path / "profile-shot", "--window-size=1280,1600", f"--screenshot={screenshot}", url)
    assert screenshot.read_bytes()[:4] == b"\x89PNG" and screenshot.stat().st_size > 20_000
    ARTEFACT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(screenshot, ARTEFACT)
