"""Requirement levels: what kind of promise a check holds an implementation to.

* ``MUST``: what every correct implementation does -- numbers within the bound,
  bad settings refused on every rank before any collective, no silent wrong
  rows, determinism when asked, no hang.
* ``SHOULD``: what the feature documents but a correct implementation may do
  otherwise -- declared error types, one warning per ignored setting, the
  legacy environment variables, a fallback warning.
* ``STRUCTURE``: how the overlap is achieved, judged against what the
  implementation declares (``docs/DESIGN.md#overlap-structure``).

A test may hold several checks (:class:`~conformance.record.verdicts.Verdicts`);
each is recorded with its level, and ``--coc-gate`` chooses which levels fail the run.
"""

from __future__ import annotations

import enum


class Level(str, enum.Enum):
    MUST = "MUST"
    SHOULD = "SHOULD"
    STRUCTURE = "STRUCTURE"

    @classmethod
    def parse_many(cls, text: str) -> frozenset[Level]:
        """``"must,structure"`` (case-insensitive; ``all`` for every level)."""
        words = {w.strip().upper() for w in text.split(",") if w.strip()}
        if words == {"ALL"}:
            return frozenset(cls)
        unknown = words - {level.value for level in cls}
        if unknown or not words:
            raise ValueError(f"unknown requirement level(s) {sorted(unknown) or [text]}; "
                             f"choose from {[level.value for level in cls]} or 'all'")
        return frozenset(cls(w) for w in words)
