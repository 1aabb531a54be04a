"""Stored serial golden outputs (``docs/DESIGN.md#error-bound``): catalogue, float64 definitions, verified loader.

``golden.catalogue()`` lists the cases for parametrisation; ``golden.load(id)``
returns a checksum-verified ``GoldenCase``; ``golden.serial`` holds the serial
definitions also used for live references. Regenerate only with
``python -m golden.generate``.
"""

from __future__ import annotations

from golden.catalogue import CATALOGUE, Case, LayerCase, OpCase, QuantCase
from golden.store import (
    GoldenCase,
    GoldenError,
    GoldenIntegrityError,
    GoldenMissingError,
    Store,
    load,
)


def catalogue(kind: str | None = None) -> tuple[Case, ...]:
    """All catalogue cases, or those of one ``kind`` (``layer``, ``op``, ``w8a16``)."""
    return tuple(c for c in CATALOGUE if kind is None or c.kind == kind)


__all__ = ["Case", "GoldenCase", "GoldenError", "GoldenIntegrityError", "GoldenMissingError",
           "LayerCase", "OpCase", "QuantCase", "Store", "catalogue", "load"]
