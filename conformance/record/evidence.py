"""What the checks of the running case saw, kept for the report: comparisons, texts, timelines, a description.

The judge never talks to a report: a check records its evidence here, and the
reporting hooks, when a report is being written (``--alluredir``), open a
collection before the case and attach what it holds after it.  With no
collection open, recording costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coc_shared.timeline import Timeline
    from conformance.record.comparison import Comparison


@dataclass
class CaseEvidence:
    """One case's evidence, in the order the checks recorded it."""

    #: Each numeric comparison and whether it failed its bound.
    comparisons: list[tuple[Comparison, bool]] = field(default_factory=list)
    #: ``(title, body)`` text attachments.
    texts: list[tuple[str, str]] = field(default_factory=list)
    #: ``(title, predicted, measured, unit)`` pipeline timelines (``measured`` a Timeline or lanes).
    timelines: list[tuple[str, Timeline | None, Any, str]] = field(default_factory=list)
    #: What the case says it is (feature, story, title, parameters), replacing the defaults.
    description: dict[str, Any] = field(default_factory=dict)


_collecting: CaseEvidence | None = None


def begin() -> CaseEvidence:
    """Open a fresh collection for the case about to run."""
    global _collecting
    _collecting = CaseEvidence()
    return _collecting


def end() -> CaseEvidence | None:
    """Close the collection and hand over what it holds (None if none was open)."""
    global _collecting
    found, _collecting = _collecting, None
    return found


def comparison(found: Comparison, *, failed: bool) -> None:
    if _collecting is not None:
        _collecting.comparisons.append((found, failed))


def text(body: str, title: str) -> None:
    if _collecting is not None and body:
        _collecting.texts.append((title, body))


def timeline(predicted: Timeline | None, measured: Any, title: str, *, unit: str = "us") -> None:
    """A pipeline's lanes, predicted and measured, in ``unit`` (the unit of the costs the model was given)."""
    if _collecting is not None and (predicted is not None or measured is not None):
        _collecting.timelines.append((title, predicted, measured, unit))


def describe(*, feature: str, story: str, title: str | None = None, **params: Mapping[str, Any] | Any) -> None:
    """Name the running case's feature (op or layer), story (mode), title and shown parameters."""
    if _collecting is not None:
        _collecting.description = {"feature": feature, "story": story, "title": title, **params}
