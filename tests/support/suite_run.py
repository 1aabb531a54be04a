"""The outcome of one run of the conformance suite in a subprocess."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SuiteRun:
    """Outcome of one conformance-suite run in a subprocess."""

    failed: set[str]
    passed: int
    output: str
    outcomes: dict[str, int]
    ret: int
