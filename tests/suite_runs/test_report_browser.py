"""The built report, opened in a real browser (headless Chromium), is what a reviewer decides from.

The suite's configuration cases run against a faulty implementation
(environment beats command line: exactly one case fails), beside one CPU perf
case (its gate is not enforced here: not judged); the offline report is built
twice with one history file (the quality gate fails both builds on that case,
and the report is built all the same), and Chromium renders it from disk.
Everything is read from the rendered DOM: the verdict block and its per-level
table (equal to the terminal's), the failed case's check step with its level
and its reproduce command, the not-judged case shown skipped (never passed),
a description with a height, and no console error (a probe script added to a
copy of the page records what the DOM cannot say: the description frame's
height and console errors).  Screenshots of the overview and of the failure
are kept in ``reports/browser/``.
"""

from __future__ import annotations

import hashlib
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

ARTEFACTS = ROOT / "reports" / "browser"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
_CLI = report_build.TOOL_DIR / "node_modules" / ".bin" / "allure"
IMPL = "tests.support.faulty_impls:EnvBeatsCommandLine"
FAILED_CASE = "Effective config and warnings [setting=cli-over-env]"
NOT_JUDGED_CASE = "Perf gate [cpu-gloo/balanced-rs-tp2]"
LEVELS = ("MUST", "SHOULD", "STRUCTURE")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt install chromium)"),
    pytest.mark.skipif(shutil.which("npm") is None and not _CLI.exists(),
                       reason="npm is not installed: the report is built with npm's `allure`"),
]

#: Added to a copy of the page: writes console errors and the description frame's height onto <body>.
PROBE = """<script>(function () {
  var errors = [], log = console.error;
  console.error = function () {
    errors.push([].map.call(arguments, String).join(" "));
    log.apply(console, arguments);
  };
  window.addEventListener("error", function (e) { errors.push(String(e.message)); });
  setInterval(function () {
    if (!document.body) return;
    document.body.setAttribute("data-probe-errors", JSON.stringify(errors));
    var frame = document.querySelector('[data-testid="test-result-description-frame"]');
    if (frame) {
      document.body.setAttribute("data-probe-description-height", String(frame.getBoundingClientRect().height));
    }
  }, 100);
})();</script>"""

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                   "wbr"})


class Page(HTMLParser):
    """The rendered DOM: ``(data-testid, text, ancestors' test ids, attributes)`` of every element with a test id."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.items: list[tuple[str, list[str], tuple[str, ...], dict[str, str | None]]] = []
        self.body: dict[str, str | None] = {}
        self._stack: list[int | None] = []  # per open element: its item, if it carries a test id
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.body = dict(attrs)
        if tag in _VOID:
            return
        testid = dict(attrs).get("data-testid")
        if testid is None:
            self._stack.append(None)
            return
        ancestors = tuple(self.items[i][0] for i in self._stack if i is not None)
        self.items.append((testid, [], ancestors, dict(attrs)))
        self._stack.append(len(self.items) - 1)

    def handle_endtag(self, tag: str) -> None:
        if tag not in _VOID and self._stack:
            self._stack.pop()

    def handle_data(self, data: str) -> None:
        for i in self._stack:
            if i is not None:
                self.items[i][1].append(data)

    def texts(self, testid: str, within: str | None = None) -> list[str]:
        return [" ".join("".join(text).split()) for tid, text, ancestors, _ in self.items
                if tid == testid and (within is None or within in ancestors)]

    def variables(self) -> dict[str, str]:
        keys = self.texts("metadata-item-key", within="report-variables")
        values = self.texts("metadata-item-value", within="report-variables")
        return dict(zip(keys, values, strict=True))

    def leaf_id(self, title: str) -> str:
        """The test result id of the tree leaf titled ``title``."""
        for tid, text, _, attrs in self.items:
            if tid == "tree-leaf" and title in "".join(text):
                return str(attrs["id"])
        raise AssertionError(f"no tree leaf titled {title!r}")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args],
        capture_output=True, text=True, timeout=180, check=True,
    )


def _open(page: Path, tmp_path: Path, route: str, screenshot: Path | None = None) -> Page:
    url = page.as_uri() + (f"#/{route}" if route else "")
    dom = Page(_chromium(tmp_path / f"profile-{route or 'overview'}", "--dump-dom", url).stdout)
    assert json.loads(dom.body.get("data-probe-errors") or "null") == [], dom.body  # no console error
    if screenshot is not None:
        _chromium(tmp_path / f"profile-shot-{route or 'overview'}", "--window-size=1280,1600",
                  f"--screenshot={screenshot}", url)
        assert screenshot.read_bytes()[:4] == b"\x89PNG" and screenshot.stat().st_size > 20_000
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(screenshot, ARTEFACTS / screenshot.name)
    return dom


def _result_id(results: Path, name: str) -> str:
    """The report's id of the result named ``name`` (Allure 3: the md5 of its uuid)."""
    for path in results.glob("*-result.json"):
        result = json.loads(path.read_text())
        if result["name"] == name:
            return hashlib.md5(result["uuid"].encode()).hexdigest()
    raise AssertionError(f"no result named {name!r} in {results}")


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


def _terminal_levels(output: str) -> dict[str, str]:
    """The terminal's requirement-level table: level -> the rest of its line."""
    lines = output.split("coc-conformance: requirement levels", 1)[1].splitlines()[1:]
    return {line.split()[0]: line.removeprefix(line.split()[0]).strip()
            for line in lines if line.split() and line.split()[0] in LEVELS}


def test_report_in_browser_is_what_a_reviewer_decides_from(run_suite: Callable[..., object], tmp_path: Path) -> None:
    results, history = tmp_path / "allure-results", tmp_path / "allure-history.jsonl"
    run = run_suite("test_config", IMPL, "conformance.suite.test_perf", "-k", "effective_config or balanced and rs",
                    "--coc-perf-figures", f"--alluredir={results}")
    assert len(run.failed) == 1 and run.passed == 12, run.output  # type: ignore[attr-defined]

    first = _build(results, tmp_path / "report-1", history)
    built = _build(results, tmp_path / "report", history)
    assert first["tests"] == {"total": 13, "new": 13, "passed": 11, "failed": 1, "skipped": 1}
    assert built["tests"] == {"total": 13, "passed": 11, "failed": 1, "skipped": 1}  # none new: history ids held
    assert len(history.read_text().splitlines()) == 2
    original = Path(str(built["report"]))
    html = original.read_text(encoding="utf-8")
    assert "googletagmanager" not in html
    page = original.with_name("probed.html")
    page.write_text(html.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")

    # 1. The verdict first: conformant or not, the terminal's per-level table, the gate, what was judged where.
    overview = _open(page, tmp_path, "", tmp_path / "report-overview.png")
    shown = overview.variables()
    assert list(shown)[0] == "verdict", shown
    assert shown["verdict"].startswith("NOT CONFORMANT at MUST, SHOULD, STRUCTURE"), shown
    terminal = _terminal_levels(run.output)  # type: ignore[attr-defined]
    assert terminal and {level: " ".join(shown[level].split()) for level in terminal} == \
        {level: " ".join(line.split()) for level, line in terminal.items()}, (shown, terminal)
    assert shown["gate"].startswith("FAILED") and shown["implementation"] == IMPL and shown["device"] == "cpu"
    assert "not judged" in shown["profile"], shown

    # 2-5. The failed case: its check step with level and outcome, the command that reproduces it.
    failure = _open(page, tmp_path, overview.leaf_id(FAILED_CASE), tmp_path / "report-failure.png")
    assert "[SHOULD] effective settings: failed" in failure.texts("test-result-step-title"), \
        failure.texts("test-result-step-title")
    errors = " ".join(failure.texts("test-result-error"))
    assert "reproduce: pytest 'conformance/suite/test_config.py::test_effective_config_and_warnings[cli-over-env]'" \
        f" --coc-impl {IMPL}" in errors, errors

    # 3. The perf case whose gate is not enforced here: skipped with the reason, never passed; its description shows.
    not_judged = _open(page, tmp_path, _result_id(results, NOT_JUDGED_CASE))  # its group starts collapsed
    assert not_judged.texts("test-result-status-skipped") and not not_judged.texts("test-result-status-passed")
    steps = not_judged.texts("test-result-step-title")
    assert any(step.endswith(": not judged") and step.startswith("[") for step in steps), steps
    assert float(not_judged.body.get("data-probe-description-height") or 0) > 50, not_judged.body
