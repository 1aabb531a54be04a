"""Checks counted by requirement level and outcome: the one count the terminal, the gate's verdict and the report show.

A check counts under its outcome (``passed``, ``failed``, ``not judged``,
``not offered``, or any other a newer record carries); a failed check of a
level the gate leaves out counts as ``not gated``.  :func:`lines` writes the table the terminal
prints and the report's overview repeats, word for word.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from conformance.judge.levels import Level
from conformance.judge.verdicts import FAILED, NOT_JUDGED, NOT_OFFERED, PASSED, outcome_of

NOT_GATED = "not gated"
#: The columns every level's line shows, in order (other outcomes follow them).
COLUMNS = (PASSED, FAILED, NOT_GATED, NOT_JUDGED, NOT_OFFERED)


def column(check: Mapping[str, Any], gate: frozenset[Level]) -> str:
    """Where ``check`` counts: its outcome, or ``not gated`` for a failure of a level outside ``gate``."""
    outcome = outcome_of(check)
    return NOT_GATED if outcome == FAILED and Level(check["level"]) not in gate else outcome


def tally(checks: Iterable[Mapping[str, Any]], gate: frozenset[Level]) -> Counter[tuple[str, str]]:
    """``(level, column)`` -> number of checks."""
    return Counter((str(check["level"]), column(check, gate)) for check in checks)


def level_line(level: Level, counts: Counter[tuple[str, str]], gate: frozenset[Level]) -> str | None:
    """One level's line of the table (None when it holds no check)."""
    shown = {outcome: counts[(level.value, outcome)] for outcome in COLUMNS}
    others = {o: n for (lvl, o), n in sorted(counts.items()) if lvl == level.value and o not in COLUMNS and n}
    if not any(shown.values()) and not others:
        return None
    extra = "".join(f", {n:>4} {o}" for o, n in others.items())
    return (f"{level.value:<10} {shown[PASSED]:>5} checks passed, {shown[FAILED]:>4} failed, "
            f"{shown[NOT_GATED]:>4} failed but not gated, {shown[NOT_JUDGED]:>4} not judged, "
            f"{shown[NOT_OFFERED]:>4} not offered{extra}   "
            f"({'gates' if level in gate else 'not gated'})")


def lines(counts: Counter[tuple[str, str]], gate: frozenset[Level]) -> list[str]:
    """The table, one line per level that holds a check."""
    return [line for level in Level if (line := level_line(level, counts, gate)) is not None]
