"""The built report, opened in a real browser (headless Chromium), is what a reviewer decides from.

Two implementations run one after the other, as on a reviewer's machine: a
faulty one (its fused ops leave the column tail of ``n`` = 43 unwritten: four
MUST failures) beside passing configuration cases and a CPU perf case whose
gate is not enforced here (skipped, not judged), then the reference on the
same ops cases, its summary written where both runs' summaries used to land
(beside the results folder).  The faulty run's report is built twice with
one history file: against the reference's summary as a baseline, and with
the reference's summary given as its own (no verdict: exit 2).  Chromium
renders each from disk, and everything is read from the rendered DOM: the
verdict banner on top (NOT CONFORMANT at MUST, STRUCTURE not judged, the
faulty implementation named, each level's counts equal to the terminal's
table), the page opened at its top, the baseline view listing the cases
whose checks changed before anything else, the failed gate in the Quality
Gates tab, a failed case headed by its failed check and level with one tag
per level, whole chips and an error-statistics table in a frame sized to its
content, the perf case skipped and named in full, and no console error on
any page (a probe script added to a copy of the page records what the DOM
cannot say: frame heights, scroll positions, cut chips and console errors;
Chromium's own log gives the rest).  Screenshots of the overview and of one
failure are kept in ``reports/browser/``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conformance.reporting import allure_cli
from tests.support import ROOT

ARTEFACTS = ROOT / "reports" / "browser"
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
_CLI = allure_cli.TOOL_DIR / "node_modules" / ".bin" / "allure"
FAULTY = "tests.support.faulty_impls:UnwrittenColumnTail"
REFERENCE = "coc_impl.reference:ReferenceCoC"
CORNER = "corner_n_not_multiple_of_8"
FAILED_CASE = "Corner n not multiple of 8 [op=all_gather_matmul, tp=2]"
PERF_CASE = "test_perf.py::test_coc_gain_meets_profile[cpu-gloo/balanced-rs-tp2]"
LEVELS = ("MUST", "SHOULD", "STRUCTURE")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt install chromium)"),
    pytest.mark.skipif(shutil.which("npm") is None and not _CLI.exists(),
                       reason="npm is not installed: the report is built with npm's `allure`"),
]

#: Added to a copy of the page (``EXPAND``: tree nodes to open, Allure's own stored state): writes onto <body> the
#: console errors, each frame's height by title, the page's and the tree pane's scroll, the verdict banner's top,
#: and the metadata chips whose text is cut.
PROBE = """<script>(function () {
  var errors = [], log = console.error;
  console.error = function () {
    errors.push([].map.call(arguments, String).join(" "));
    log.apply(console, arguments);
  };
  window.addEventListener("error", function (e) { errors.push(String(e.message)); });
  var expand = EXPAND;
  if (expand.length) localStorage.setItem("expandedTrees", JSON.stringify(expand));
  setInterval(function () {
    if (!document.body) return;
    var frames = {}, pane = document.querySelector('[data-testid="base-layout"]');
    var banner = document.getElementById("coc-verdict");
    document.querySelectorAll("iframe").forEach(function (frame) {
      frames[frame.title] = Math.max(frames[frame.title] || 0, frame.getBoundingClientRect().height);
    });
    var cut = [].filter.call(document.querySelectorAll('[data-testid="metadata-item-value"] *'), function (e) {
      return e.scrollWidth > e.clientWidth + 1;
    }).map(function (e) { return e.textContent; });
    document.body.setAttribute("data-probe", JSON.stringify({errors: errors, frames: frames, scrollY: window.scrollY,
      pane: pane ? pane.scrollTop : null, bannerTop: banner ? banner.getBoundingClientRect().top : null, cut: cut}));
  }, 100);
})();</script>"""

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                   "wbr"})


class Page(HTMLParser):
    """The rendered DOM: ``(data-testid, text, ancestors' test ids, attributes)`` of every element with a test id,
    in document order, and what the probe wrote."""

    def __init__(self, dom: str, console: list[str]) -> None:
        super().__init__()
        self.items: list[tuple[str, list[str], tuple[str, ...], dict[str, str | None]]] = []
        self.body: dict[str, str | None] = {}
        self.console = console  #: Chromium's console messages of level error
        self._stack: list[int | None] = []  # per open element: its item, if it carries a test id
        self.feed(dom)
        self.probe: dict[str, Any] = json.loads(self.body.get("data-probe") or "{}")

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

    def text(self, testid: str) -> str:
        (found,) = self.texts(testid)
        return found

    def attribute(self, testid: str, name: str) -> list[str | None]:
        return [attrs.get(name) for tid, _, _, attrs in self.items if tid == testid]

    def order(self, *testids: str) -> list[str]:
        """The first of each of ``testids`` in document order."""
        seen = [tid for tid, _, _, _ in self.items if tid in testids]
        return sorted(set(seen), key=seen.index)

    def variables(self) -> dict[str, str]:
        keys = self.texts("metadata-item-key", within="report-variables")
        values = self.texts("metadata-item-value", within="report-variables")
        return dict(zip(keys, values, strict=True))

    def label(self, key: str) -> str:
        """The text of the case's metadata entry ``key`` (its tags, say: the chips' texts, run together)."""
        shown = [(tid, "".join(text).strip()) for tid, text, _, _ in self.items
                 if tid in ("metadata-item-key", "metadata-item-value")]
        return next(value for (tid, name), (_, value) in zip(shown, shown[1:], strict=False)
                    if tid == "metadata-item-key" and name == key)


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args],
        capture_output=True, text=True, timeout=180, check=True,
    )


def _open(page: Path, tmp_path: Path, route: str = "", screenshot: str | None = None,
          expand: list[str] | None = None) -> Page:
    """``page`` at ``route``, with the probe, in an 800 x 600 window (the overview is taller: it must open at its
    top); ``screenshot`` is kept among CI's artefacts."""
    probed = page.with_name(f"probed-{hashlib.md5(route.encode()).hexdigest()[:8]}.html")
    probe = PROBE.replace("EXPAND", json.dumps(expand or []))
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>" + probe, 1), encoding="utf-8")
    url = probed.as_uri() + (f"#/{route}" if route else "")
    profile = tmp_path / f"profile-{page.parent.name}-{route.replace('/', '-') or 'overview'}"
    done = _chromium(profile, "--dump-dom", url)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line and "Error" in line]
    dom = Page(done.stdout, console)
    assert dom.probe.get("errors") == [] and console == [], (dom.probe, console)  # no console error
    if screenshot is not None:
        shot = tmp_path / screenshot
        _chromium(profile.with_name(profile.name + "-shot"), "--window-size=1280,1600", f"--screenshot={shot}", url)
        assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, ARTEFACTS / screenshot)
    return dom


def _results(results: Path) -> dict[str, dict[str, Any]]:
    """Every result of the folder by name."""
    return {doc["name"]: doc for doc in (json.loads(p.read_text()) for p in results.glob("*-result.json"))}


def _report_id(result: dict[str, Any]) -> str:
    """The report's id of a result (Allure 3: the md5 of its uuid)."""
    return hashlib.md5(result["uuid"].encode()).hexdigest()


def _attachment_ids(page: Path, report_id: str) -> list[str]:
    """The tree ids of a result's attachments in the built page (its data is embedded, base64)."""
    data = re.search(rf'd\("data/test-results/{report_id}\.json","([A-Za-z0-9+/=]*)"\)', page.read_text())
    assert data, report_id
    steps = json.loads(base64.b64decode(data.group(1)))["steps"]
    return [f"attachment-{step['link']['id']}" for step in steps if step.get("type") == "attachment"]


def _build(results: Path, out: Path, *options: str) -> tuple[int, dict[str, Any]]:
    """The README's one command, in a subprocess (the first build may run ``npm ci``)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "conformance.reporting.build", "--results", str(results), "--out", str(out), *options],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": path},
    )
    assert done.stdout.strip(), done.stderr
    built: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return done.returncode, built


def _terminal_levels(output: str) -> dict[str, str]:
    """The terminal's requirement-level table: level -> the rest of its line."""
    lines = output.split("coc-conformance: requirement levels", 1)[1].splitlines()[1:]
    return {line.split()[0]: line.removeprefix(line.split()[0]).strip()
            for line in lines if line.split() and line.split()[0] in LEVELS}


def test_report_in_browser_is_what_a_reviewer_decides_from(run_suite: Callable[..., Any], tmp_path: Path) -> None:
    results, history = tmp_path / "allure-results", tmp_path / "allure-history.jsonl"
    faulty = run_suite("test_ops", FAULTY, "conformance.suite.test_config", "conformance.suite.test_perf", "-k",
                       f"{CORNER} or (effective_config and cli) or (balanced and rs)", f"--alluredir={results}")
    assert len(faulty.failed) == 4 and faulty.passed == 6, faulty.output
    assert (results / "coc-summary.json").is_file()  # the run's summary, inside its own results folder
    # The reference next, its summary where the faulty run's used to be written (beside its results folder).
    other_summary = tmp_path / "coc-summary.json"
    reference = run_suite("test_ops", REFERENCE, "-k", CORNER, f"--alluredir={tmp_path / 'reference-results'}",
                          "--coc-summary", str(other_summary))
    assert reference.passed == 4 and not reference.failed, reference.output

    code, built = _build(results, tmp_path / "report", "--history", str(history), "--baseline", str(other_summary))
    assert code == 1 and not built["quality_gate"]["passed"], built  # the gate fails; the report is built
    assert built["tests"] == {"total": 11, "new": 11, "passed": 6, "failed": 4, "skipped": 1}
    index = Path(built["report"])
    assert "googletagmanager" not in index.read_text(encoding="utf-8")
    named = _results(results)

    # 1. The verdict first, on top of the page as it opens: the faulty run's own, coloured, each level with counts.
    overview = _open(index, tmp_path, screenshot="report-overview.png")
    headline = overview.text("coc-verdict-headline")
    assert headline.startswith("NOT CONFORMANT at MUST: 4 case(s) failed") and \
        headline.endswith("not judged at STRUCTURE"), headline
    assert overview.attribute("coc-verdict", "data-outcome") == ["red"]
    assert overview.text("coc-fact-implementation") == f"implementation: {FAULTY}"
    levels = dict(zip(overview.texts("coc-level"), overview.attribute("coc-level", "data-outcome"), strict=True))
    assert [(line.split()[0], outcome) for line, outcome in levels.items()] == \
        [("MUST", "red"), ("SHOULD", "green"), ("STRUCTURE", "amber")], levels
    assert "4 failed" in next(iter(levels)) and next(reversed(levels)).endswith("not judged")
    assert overview.probe["scrollY"] == 0 and overview.probe["pane"] == 0 and overview.probe["bannerTop"] < 20
    shown = overview.variables()
    assert list(shown)[0] == "verdict" and shown["verdict"] == headline and shown["implementation"] == FAULTY
    terminal = _terminal_levels(faulty.output)
    assert set(terminal) == set(LEVELS) and {level: " ".join(shown[level].split()) for level in terminal} == \
        {level: " ".join(line.split()) for level, line in terminal.items()}, (shown, terminal)
    assert "not judged" in shown["profile"] and shown["device"] == "cpu"

    # 2. The gate: failed, and why, on the overview and in the Quality Gates tab.
    assert overview.text("coc-fact-gate").startswith("gate: FAILED: The number of failed tests 4 exceeds")
    assert overview.attribute("coc-fact-gate", "data-outcome") == ["red"]
    gates = _open(index, tmp_path, "qualityGate")
    assert gates.texts("quality-gate-result-rule") == ["coc-conformance/maxFailures"]
    assert "failed tests 4 exceeds the allowed threshold value 0" in gates.text("quality-gate-result-message")

    # 3. The baseline view before anything else: the cases whose checks changed, each with the check that did.
    assert overview.order("coc-verdict-headline", "coc-baseline", "coc-levels", "report-variables") == \
        ["coc-verdict-headline", "coc-baseline", "coc-levels", "report-variables"]
    assert overview.texts("coc-baseline-section") and overview.texts("coc-baseline-section")[0].startswith(
        "New failures (4)")
    rows = overview.texts("coc-baseline-row")
    assert sorted(row.split()[0] for row in rows) == sorted(
        f"test_ops.py::test_{CORNER}[{op}-tp2]" for op in ("all_gather_matmul", "all_gather_matmul_v2",
                                                          "matmul_all_reduce", "matmul_reduce_scatter"))
    assert all(row.endswith("numerics (MUST): passed -> failed") for row in rows), rows
    assert built["baseline"]["red"] and list(built["baseline"]["sections"]) == ["New failures"]
    not_judged = overview.text("coc-not-judged")
    assert PERF_CASE in not_judged and not_judged.startswith("not judged (1, never counted as passed)")

    # 4. A failed case: headed by its failed check and level, one tag per level, whole chips, the error
    #    statistics in a frame as tall as its table, the command that reproduces it, no frame of verdicts.py.
    failed = named[FAILED_CASE]
    route = _report_id(failed)
    failure = _open(index, tmp_path, route, "report-failure.png", expand=_attachment_ids(index, route))
    message = failure.texts("test-result-error-message")
    assert message and message[0].startswith("[MUST] numerics: failed conformance.record.failures.NumericMismatch")
    assert f"reproduce: pytest 'conformance/suite/test_ops.py::test_{CORNER}[all_gather_matmul-tp2]' " \
           f"--coc-impl {FAULTY}" in message[0]
    assert "[MUST] numerics: failed" in failure.texts("test-result-step-title")
    tags = failure.label("tag")  # one per level, its worst outcome: never "MUST failed" beside "MUST passed"
    assert tags.startswith("MUST failedSHOULD passed") and "MUST passed" not in tags, tags
    assert failure.probe["cut"] == [], failure.probe
    assert failure.probe["frames"]["Markdown attachment"] > 400, failure.probe  # 22 rows, not 150 px
    assert 10 < failure.probe["frames"]["Description"] < 100, failure.probe  # one line, not 12em
    assert not any("record/verdicts.py" in trace for trace in failure.texts("test-result-error-trace"))
    steps = [step for doc in named.values() if doc["status"] == "failed" for step in doc["steps"]]
    assert any(step["stop"] > step["start"] for step in steps if "start" in step), steps  # not every step 0 s

    # 5. The perf case whose gate is not enforced here: skipped (never passed), named with its profile and TP.
    (perf,) = (doc for doc in named.values() if doc["status"] == "skipped")
    assert perf["name"] == "Coc gain meets profile [case=cpu-gloo/balanced-rs-tp2]"
    skipped = _open(index, tmp_path, _report_id(perf))
    assert skipped.texts("test-result-status-skipped") and not skipped.texts("test-result-status-passed")
    assert any(step.startswith("skipped: not judged") for step in skipped.texts("test-result-step-title"))
    _open(index, tmp_path, "charts")  # no console error there either

    # 6. The other run's summary given as this run's: no verdict, loudly, and the build says why (exit 2).
    code, mixed = _build(results, tmp_path / "report-mixed", "--history", str(history), "--summary", str(other_summary))
    assert code == 2 and mixed["verdict"]["verdict"].startswith("NO VERDICT"), mixed["verdict"]
    assert mixed["tests"] == {"total": 11, "passed": 6, "failed": 4, "skipped": 1}  # none new: history ids held
    assert len(history.read_text().splitlines()) == 2
    errors = _open(Path(mixed["report"]), tmp_path, "globalErrors")
    assert errors.text("coc-verdict-headline").startswith("NO VERDICT: the summary")
    assert errors.attribute("coc-verdict", "data-outcome") == ["red"] and not errors.texts("coc-levels")
    said = " ".join(errors.texts("test-result-error-message"))
    assert f"the summary judged {REFERENCE}; the results judged {FAULTY}" in said and "CONFORMANT at" not in said
