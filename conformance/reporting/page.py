"""What the build adds to Allure's page: the verdict at its top, styles, and two fixes for a report opened from disk.

* The verdict banner (:func:`banner`), static HTML before Allure's app, so it
  is the first thing the page shows and needs nothing to render: the
  headline coloured by outcome (red: not conformant, not decided or no
  verdict; green: conformant; amber: not judged), the baseline view when
  there is one, then each level with its counts and verdict, the gate and
  why, what ran where, and the cases not judged, linked.  On a case's page
  only its headline shows.
* Frames sized to their content: Allure measures a description's or a
  markdown attachment's frame when it loads, and cannot from disk (a
  ``blob:`` document is another origin there), leaving a table at 150 px;
  the script hands each such frame the same HTML as ``srcdoc``, a document
  of the page's own origin, which Allure then measures.
* The page opens at its top: Allure focuses the tree's first row on load and
  scrolls it into view; the script lets nothing scroll the page until the
  reader acts.
* Metadata values (tags, parameters, the verdict's variables) are shown
  whole, not cut to a chip's width.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conformance.record import level_tally
from conformance.record.level_tally import RunVerdict

_ANALYTICS = re.compile(
    r"\s*<script async src=\"https://www\.googletagmanager\.com/[^\"]*\"></script>"
    r"\s*<script>[^<]*gtag\([^<]*</script>")
_APP = '<div id="app"></div>'
#: The colours of the outcomes: border and text, background.
TONES = {"red": ("#b91c1c", "#fef2f2"), "green": ("#15803d", "#f0fdf4"), "amber": ("#b45309", "#fffbeb"),
         "grey": ("#4b5563", "#f3f4f6")}

_STYLE = """
#coc-page{display:flex;flex-direction:column;height:100vh}
#app{flex:1 1 auto;min-height:0}#app>div{height:100%!important}#app>div>*{min-height:0}
#coc-verdict{flex:none;box-sizing:border-box;width:calc(100% - 24px);max-width:960px;max-height:45vh;overflow:auto;
 margin:8px auto 4px;padding:10px 20px;border-left:8px solid;border-radius:8px;
 font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#111827}
#coc-verdict code{font:12px ui-monospace,monospace}
#coc-verdict .coc-headline{font-size:20px;font-weight:700;margin:0 0 6px}
#coc-verdict table{border-collapse:collapse;margin:4px 0 8px}
#coc-verdict th,#coc-verdict td{text-align:left;vertical-align:top;padding:2px 12px 2px 0}
#coc-verdict .coc-baseline td{max-width:30em}#coc-verdict .coc-baseline td:first-child{min-width:16em;
 overflow-wrap:anywhere}#coc-verdict td.coc-changes{white-space:nowrap}
#coc-verdict details{margin:4px 0}#coc-verdict summary{font-weight:600;cursor:pointer}
#coc-verdict .coc-baseline{margin:6px 0 10px;padding:6px 12px;background:#fff;border-left:4px solid;border-radius:6px}
#coc-verdict .coc-title{font-weight:600;margin:0 0 4px}
#coc-verdict[data-route=result] .coc-detail{display:none}
#coc-verdict[data-route=result] .coc-headline{font-size:15px;margin:0}
[data-testid="metadata-item-value"] *{white-space:normal!important;overflow:visible!important;
 text-overflow:clip!important;max-width:none!important}
[data-testid="report-variables"] [data-testid="metadata-list"]{grid-template-columns:100%!important}
""" + "".join(f"""
#coc-verdict[data-outcome={tone}],#coc-verdict .coc-baseline[data-outcome={tone}]{{border-color:{ink};
 background:{paper}}}
#coc-verdict[data-outcome={tone}] .coc-headline,#coc-verdict [data-outcome={tone}]>th,
#coc-verdict [data-outcome={tone}]>summary,#coc-verdict [data-outcome={tone}] .coc-verdict{{color:{ink}}}"""
               for tone, (ink, paper) in TONES.items())

_SCRIPT = """(function () {
  var blobs = new Map(), make = URL.createObjectURL;
  URL.createObjectURL = function (made) {
    var url = make.apply(URL, arguments);
    if (made instanceof Blob && /^text\\/html/.test(made.type)) blobs.set(url, made);
    return url;
  };
  function inline(frame) {
    var made = blobs.get(frame.getAttribute("src"));
    if (!made || frame.hasAttribute("srcdoc")) return;
    frame.setAttribute("srcdoc", "");
    made.text().then(function (text) { frame.srcdoc = text; });
  }
  var acted = false, scroll = Element.prototype.scrollIntoView;
  ["keydown", "pointerdown", "wheel", "touchstart"].forEach(function (name) {
    addEventListener(name, function () { acted = true; }, {capture: true, passive: true});
  });
  Element.prototype.scrollIntoView = function () { if (acted) return scroll.apply(this, arguments); };
  document.addEventListener("scroll", function (event) {
    var pane = event.target;
    if (!acted && pane instanceof Element && pane.hasAttribute("data-tree-scroll-container")) pane.scrollTop = 0;
  }, true);
  function route() {
    var shown = document.getElementById("coc-verdict");
    if (shown) shown.setAttribute("data-route", /[0-9a-f]{32}/.test(location.hash) ? "result" : "overview");
  }
  addEventListener("hashchange", route);
  new MutationObserver(function () {
    route();
    document.querySelectorAll('iframe[src^="blob:"]').forEach(inline);
  }).observe(document, {subtree: true, childList: true, attributes: true, attributeFilter: ["src"]});
})();"""


class PageError(RuntimeError):
    """Allure's page changed shape: what the build adds to it would be lost."""


#: What a level or the run comes to (:mod:`conformance.record.level_tally`'s outcomes) -> its colour.
_TONES = {level_tally.CONFORMANT: "green", level_tally.NOT_JUDGED: "amber", level_tally.NOT_CONFORMANT: "red",
          level_tally.NOT_DECIDED: "red", level_tally.NO_VERDICT: "red", level_tally.NOT_GATED: "grey"}


def tone(outcome: str) -> str:
    """The colour of what a level or the run comes to: green when conformant, amber when not judged, red when
    not conformant, not decided or without a verdict, grey when not gated (or an outcome this build does not know:
    never green)."""
    return _TONES.get(outcome, "grey")


#: The terminal's column names, as the banner's cells say them.
_COLUMN_NAMES = {level_tally.NOT_GATED: "failed but not gated"}


@dataclass(frozen=True)
class Banner:
    """What the top of the report says, in order."""

    verdict: RunVerdict
    #: Each level: its name, its counts as the terminal's columns name them, and its verdict.
    levels: Sequence[tuple[str, Sequence[tuple[str, int]], str]] = ()
    #: ``(name, value)`` lines: the gate first.
    facts: Sequence[tuple[str, str]] = ()
    gate_passed: bool | None = None
    #: Cases whose checks were all not judged: ``(case id, the report's result id or None)``.
    not_judged: Sequence[tuple[str, str | None]] = ()
    #: The baseline view (HTML), shown right under the headline.
    baseline: str = ""
    #: What went wrong in the build itself.
    problems: Sequence[str] = field(default_factory=list)


def banner(shown: Banner) -> str:
    """The verdict banner's HTML (every part carries a ``data-testid``)."""
    esc = html.escape
    parts = [f'<section id="coc-verdict" data-testid="coc-verdict" data-outcome="{tone(shown.verdict.outcome)}">',
             f'<p class="coc-headline" data-testid="coc-verdict-headline">{esc(shown.verdict.headline)}</p>',
             '<div class="coc-detail">', shown.baseline]
    parts.extend(f'<p data-testid="coc-build-problem" data-outcome="red"><b class="coc-verdict">report build: '
                 f"{esc(problem)}</b></p>" for problem in shown.problems)
    if shown.levels:
        parts.append('<table data-testid="coc-levels">')
        for level, counts, verdict in shown.levels:
            cells = " ".join(f"<td>{n} {esc(_COLUMN_NAMES.get(column, column))}</td>" for column, n in counts)
            parts.append(f'<tr data-testid="coc-level" data-outcome="{tone(verdict)}">'
                         f'<th>{esc(level)}</th> {cells} <td class="coc-verdict">{esc(verdict)}</td></tr>')
        parts.append("</table>")
    for name, value in shown.facts:
        outcome = "" if name != "gate" or shown.gate_passed is None else \
            f' data-outcome="{"green" if shown.gate_passed else "red"}"'
        parts.append(f'<p data-testid="coc-fact-{esc(name)}"{outcome}><span class="coc-verdict">{esc(name)}: '
                     f"{esc(value)}</span></p>")
    if shown.not_judged:
        links = ", ".join(f'<a href="#/{rid}">{esc(cid)}</a>' if rid else esc(cid)
                          for cid, rid in shown.not_judged[:20])
        more = f" and {len(shown.not_judged) - 20} more" if len(shown.not_judged) > 20 else ""
        parts.append(f'<p data-testid="coc-not-judged" data-outcome="amber"><span class="coc-verdict">not judged '
                     f"({len(shown.not_judged)}, never counted as passed):</span> {links}{more}</p>")
    parts.append("</div></section>")
    return "".join(parts)


#: A passed gate's entries in the Quality Gates tab, which Allure draws as failures whatever they hold.
_GATE_PASSED = """
[data-testid="nav-tab-qualityGate"] [data-testid="counter"]{background:#dcfce7!important;color:#15803d!important}
[data-testid="quality-gate-result"]>div>svg{display:none}
[data-testid="quality-gate-result-rule"]::before{content:"\\2713  passed: ";color:#15803d}
[data-testid="quality-gate-result-message"]{background:#f0fdf4!important;border-color:#15803d!important}
[data-testid="quality-gate-result-message"] [data-testid="test-result-error-header"] p{visibility:hidden}
"""


def finish(index: Path, top: str, verdict_tone: str, gate_passed: bool = False) -> None:
    """Allure's page with analytics removed (the awesome template's Google tag is hard-wired in Allure 3.x), the
    styles and the script in its head, and ``top`` (the banner) above its app; a passed gate's entries shown
    green."""
    page = _ANALYTICS.sub("", index.read_text(encoding="utf-8"))
    if "googletagmanager" in page:
        raise PageError(f"{index}: the analytics tag changed shape; update reporting/page.py _ANALYTICS")
    if _APP not in page or "</head>" not in page:
        raise PageError(f"{index}: the page has no {_APP} or </head>: update reporting/page.py")
    ink, paper = TONES[verdict_tone]
    verdict_chip = ('[data-testid="report-variables"] [data-testid="metadata-item"]:first-child '
                    f'[data-testid="metadata-item-value"] span{{background:{paper}!important;color:{ink}!important;'
                    "font-size:14px!important;font-weight:700!important}")
    head = f"<style>{_STYLE}{verdict_chip}{_GATE_PASSED if gate_passed else ''}</style><script>{_SCRIPT}</script>"
    page = page.replace("</head>", head + "</head>", 1).replace(_APP, f'<div id="coc-page">{top}{_APP}</div>', 1)
    index.write_text(page, encoding="utf-8")
