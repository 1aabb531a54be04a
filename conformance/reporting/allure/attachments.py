"""What a case's checks recorded, attached to its Allure result: comparisons, texts, timelines, explorations.

A comparison gets its error statistics as a markdown table (the report
renders it), and figures as ``--coc-figures`` says; a failed case gets every
rank's stack, traceback and log.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import allure

from conformance.reporting.allure import recording
from conformance.reporting.allure.labels import describe_case

if TYPE_CHECKING:
    from coc_shared.timeline import Timeline
    from conformance.harness.case_errors import CaseError
    from conformance.record.comparison import Comparison
    from conformance.record.evidence import CaseEvidence

#: Tables are markdown: the report renders them (it shows CSV as raw text).
_MARKDOWN = "text/markdown"
_warned_no_plots = False


def attach_text(body: str, name: str) -> None:
    if recording.is_active() and body:
        allure.attach(body, name=name, attachment_type=allure.attachment_type.TEXT)


def attach_evidence(error: CaseError) -> None:
    """Every rank's stack (hangs, crashes), traceback and log, one attachment each."""
    for rank, stack in sorted(error.stacks.items()):
        attach_text(stack, f"rank {rank} stack")
    for outcome in error.outcomes:
        if outcome.error is not None:
            attach_text(outcome.error.traceback, f"rank {outcome.rank} traceback")
        attach_text(outcome.log, f"rank {outcome.rank} log")


def _attach_png(png: bytes | None, name: str) -> None:
    global _warned_no_plots
    if png is not None:
        allure.attach(png, name=name, attachment_type=allure.attachment_type.PNG)
    elif not _warned_no_plots:
        _warned_no_plots = True
        warnings.warn("matplotlib is not installed (pip install '.[report]'): "
                      "the Allure report has no figures", stacklevel=3)


def _table(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column markdown table (the report renders it as one): floats in 3 digits, tuples as lists."""
    def cell(value: Any) -> str:
        text = f"{value:.3e}" if isinstance(value, float) else str(list(value) if isinstance(value, tuple) else value)
        return text.replace("|", "\\|").replace("\n", " ")

    return "| statistic | value |\n|---|---|\n" + "".join(f"| {cell(k)} | {cell(v)} |\n" for k, v in rows)


#: Upper edges of the decades of |diff| / bound counted in every statistics table.
_DECADES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def ratio_decades(abs_diff: Any, bound: Any) -> list[tuple[str, int]]:
    """How many elements have |diff| / bound in each decade: the histogram as table rows."""
    import numpy as np

    diff, bnd = np.ravel(abs_diff), np.ravel(bound)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bnd > 0, diff / bnd, np.where(diff > 0, np.inf, 0.0))
    rows = [("|diff| / bound = 0", int((ratio == 0).sum()))]
    low = 0.0
    for high in _DECADES:
        rows.append((f"|diff| / bound in ({low:g}, {high:g}]", int(((ratio > low) & (ratio <= high)).sum())))
        low = high
    rows.append((f"|diff| / bound > {low:g} (violations)", int((ratio > low).sum())))
    return rows


def attach_comparison(comparison: Comparison, *, failed: bool | None = None) -> None:
    """Error statistics and their distribution as a table; figures as ``--coc-figures`` says.

    ``failed`` defaults to whether the bound was violated.  A failed comparison
    gets a histogram and a heat-map of |diff| (unless figures are ``none``), a
    passing one a histogram only with ``--coc-figures all``: drawing is the
    dearest thing a passing case would do.
    """
    if not recording.is_active():
        return
    stats = comparison.stats
    failed = failed if failed is not None else not stats.ok
    rows = [*stats.as_dict().items(), *ratio_decades(comparison.abs_diff, comparison.bound)]
    allure.attach(_table(rows), name=f"{stats.name}: error statistics", attachment_type=_MARKDOWN,
                  extension="md")
    if recording.figures() == "none" or not (failed or recording.figures() == "all"):
        return
    from conformance.reporting import plots

    _attach_png(plots.error_histogram(comparison.abs_diff, comparison.bound, title=stats.name),
                f"{stats.name}: |diff| / bound")
    if failed and comparison.abs_diff.size:
        _attach_png(plots.diff_heatmap(comparison.abs_diff, comparison.bound,
                                       title=f"{stats.name} {stats.dtype} {list(stats.shape)}"),
                    f"{stats.name}: |diff| heat-map")


#: Per-block ``(start, end)`` pairs, or per-block durations (laid back to back).
Lane = Sequence[Any]


def _intervals(lane: Lane) -> list[tuple[float, float]]:
    if not lane or not isinstance(lane[0], (int, float)):
        return [(float(start), float(end)) for start, end in lane]
    ends = list(itertools.accumulate(float(d) for d in lane))
    return list(zip([0.0, *ends[:-1]], ends, strict=True))


def _lanes(source: Timeline | Mapping[str, Lane]) -> dict[str, list[tuple[float, float]]]:
    if not isinstance(source, Mapping):
        return {"matmul": list(source.mm), "comm": list(source.comm)}
    return {("matmul" if key == "mm" else key): _intervals(lane) for key, lane in source.items()}


def attach_timeline(predicted: Timeline | None, measured: Timeline | Mapping[str, Lane] | None,
                    title: str, *, unit: str = "us") -> None:
    """A lane chart of the predicted and measured pipeline, in ``unit`` (that of the model's costs).

    ``measured`` is a Timeline or ``{"mm": lane, "comm": lane}``; a lane is a
    list of per-block ``(start, end)`` or of per-block durations.
    """
    if not recording.is_active() or (predicted is None and measured is None):
        return
    from conformance.reporting import plots

    rows: dict[str, list[tuple[float, float]]] = {}
    spans = []
    for what, source in (("predicted", predicted), ("measured", measured)):
        if source is None:
            continue
        lanes = _lanes(source)
        rows.update({f"{what} {lane}": intervals for lane, intervals in lanes.items()})
        end = max((e for intervals in lanes.values() for _, e in intervals), default=0.0)
        spans.append(f"{what} {end:.3g} {unit}")
    _attach_png(plots.lanes(rows, title=f"{title}: {', '.join(spans)}", unit=unit), f"{title}: timeline")


def attach_case_evidence(found: CaseEvidence) -> None:
    """Everything the case's checks recorded, attached after its call."""
    if not recording.is_active():
        return
    if found.description:
        describe_case(**found.description)
    for comparison, failed in found.comparisons:
        attach_comparison(comparison, failed=failed)
    for title, body in found.texts:
        attach_text(body, title)
    for title, predicted, measured, unit in found.timelines:
        attach_timeline(predicted, measured, title, unit=unit)


def attach_exploration(explored: Mapping[str, Any] | None) -> None:
    """What an exploration did: cases per dimension, cases per second, where the time went, minimal failing cases."""
    if not recording.is_active() or not explored:
        return
    import json

    rows = [("cases", explored["cases"]), ("cases per second", explored["cases_per_s"]),
            *((f"time: {k} (s)", v) for k, v in explored["time_s"].items()),
            *((f"kind {k}: {what}", v) for k, figures in explored.get("per_kind", {}).items()
              for what, v in figures.items()),
            *((f"not offered: {k}", why) for k, why in explored.get("not_offered", {}).items()),
            *((f"set aside, not run: {why}", count) for why, count in explored.get("outside", {}).items()),
            *((f"explored: {k}", v) for k, v in explored["per_dimension"].items())]
    allure.attach(_table(rows), name="exploration", attachment_type=_MARKDOWN, extension="md")
    for finding in explored["findings"]:
        allure.attach(json.dumps(finding, indent=1), name=f"minimal case: {finding['level']} {finding['check']}",
                      attachment_type=allure.attachment_type.JSON)
