"""What the checks of a case saw, kept for the report: comparisons, texts, timelines, a description.

The judge never talks to a report: a check records its evidence into the case's record
(:attr:`conformance.record.verdicts.Verdicts.evidence`), and the reporting hooks, when a report is being
written (``--alluredir``), keep it from before the case and attach what it holds after it.  Evidence nobody
keeps is not recorded: recording it costs nothing.
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
    """One case's evidence, in the order the checks recorded it (nothing unless :attr:`kept`)."""

    #: Each numeric comparison and whether it failed its bound.
    comparisons: list[tuple[Comparison, bool]] = field(default_factory=list)
    #: ``(title, body)`` text attachments.
    texts: list[tuple[str, str]] = field(default_factory=list)
    #: ``(title, predicted, measured, unit)`` pipeline timelines (``measured`` a Timeline or lanes).
    timelines: list[tuple[str, Timeline | None, Any, str]] = field(default_factory=list)
    #: What the case says it is (feature, story, title, parameters), replacing the defaults.
    description: dict[str, Any] = field(default_factory=dict)
    #: Whether a report keeps this case's evidence (else what the checks record is dropped).
    kept: bool = False

    def comparison(self, found: Comparison, *, failed: bool) -> None:
        if self.kept:
            self.comparisons.append((found, failed))

    def text(self, body: str, title: str) -> None:
        if self.kept and body:
            self.texts.append((title, body))

    def timeline(self, predicted: Timeline | None, measured: Any, title: str, *, unit: str = "us") -> None:
        """A pipeline's lanes, predicted and measured, in ``unit`` (the unit of the costs the model was given)."""
        if self.kept and (predicted is not None or measured is not None):
            self.timelines.append((title, predicted, measured, unit))

    def describe(self, *, feature: str, story: str, title: str | None = None,
                 **params: Mapping[str, Any] | Any) -> None:
        """Name the case's feature (op or layer), story (mode), title and shown parameters."""
        if self.kept:
            self.description = {"feature": feature, "story": story, "title": title, **params}
