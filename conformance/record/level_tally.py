"""Checks counted by requirement level and outcome: the one count, and the one verdict, the terminal, the gate's
verdict and the report show.

A check counts under its outcome (``passed``, ``failed``, ``not judged``,
``not offered``, or any other a newer record carries); a failed check of a level the gate leaves
out counts as ``not gated``.  :func:`lines` writes the table the terminal
prints and the report's overview repeats, word for word; each gated level's
line ends with what the level comes to (:func:`level_verdict`), and
:func:`headline` says it for the run.  A level is conformant only when at
least one of its checks was judged and none failed: a gated level with no
check judged is *not judged*, never conformant.  What a level and the run come
to is one of the outcomes below; readers key on it, never on the text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from conformance.record.levels import Level
from conformance.record.verdicts import FAILED, NOT_JUDGED, NOT_OFFERED, PASSED, outcome_of

NOT_GATED = "not gated"
#: The columns every level's line shows, in order (other outcomes follow them).
COLUMNS = (PASSED, FAILED, NOT_GATED, NOT_JUDGED, NOT_OFFERED)
#: What a gated level comes to.
CONFORMANT, NOT_CONFORMANT = "conformant", "NOT CONFORMANT"
#: The outcome of a run whose suite itself failed: nothing can be concluded from it.
NOT_DECIDED = "NOT DECIDED"
#: The outcome of a run without a complete record of its own (its summary missing, incomplete or another run's).
NO_VERDICT = "NO VERDICT"


@dataclass(frozen=True)
class RunVerdict:
    """What a run comes to: its outcome (:data:`CONFORMANT`, :data:`NOT_CONFORMANT`, :data:`NOT_JUDGED`,
    :data:`NOT_DECIDED`, :data:`NO_VERDICT`) and the line that says it, per level."""

    outcome: str
    headline: str


def column(check: Mapping[str, Any], gate: frozenset[Level]) -> str:
    """Where ``check`` counts: its outcome, or ``not gated`` for a failure of a level outside ``gate``."""
    outcome = outcome_of(check)
    return NOT_GATED if outcome == FAILED and Level(check["level"]) not in gate else outcome


def tally(checks: Iterable[Mapping[str, Any]], gate: frozenset[Level]) -> Counter[tuple[str, str]]:
    """``(level, column)`` -> number of checks."""
    return Counter((str(check["level"]), column(check, gate)) for check in checks)


def level_verdict(level: Level, counts: Counter[tuple[str, str]], gate: frozenset[Level]) -> str:
    """``NOT CONFORMANT`` (a check of it failed), ``conformant`` (checks of it passed, none failed), ``not judged``
    (no check of it passed or failed) or, for a level outside ``gate``, ``not gated``."""
    if level not in gate:
        return NOT_GATED
    if counts[(level.value, FAILED)]:
        return NOT_CONFORMANT
    return CONFORMANT if counts[(level.value, PASSED)] else NOT_JUDGED


def level_line(level: Level, counts: Counter[tuple[str, str]], gate: frozenset[Level]) -> str | None:
    """One level's line of the table (None for a level outside the gate that holds no check)."""
    shown = {outcome: counts[(level.value, outcome)] for outcome in COLUMNS}
    others = {o: n for (lvl, o), n in sorted(counts.items()) if lvl == level.value and o not in COLUMNS and n}
    if level not in gate and not any(shown.values()) and not others:
        return None
    extra = "".join(f", {n:>4} {o}" for o, n in others.items())
    judged = level_verdict(level, counts, gate)
    return (f"{level.value:<10} {shown[PASSED]:>5} checks passed, {shown[FAILED]:>4} failed, "
            f"{shown[NOT_GATED]:>4} failed but not gated, {shown[NOT_JUDGED]:>4} not judged, "
            f"{shown[NOT_OFFERED]:>4} not offered{extra}   "
            f"({NOT_GATED if judged == NOT_GATED else 'gates: ' + judged})")


def lines(counts: Counter[tuple[str, str]], gate: frozenset[Level]) -> list[str]:
    """The table: one line per gated level, and per other level that holds a check."""
    return [line for level in Level if (line := level_line(level, counts, gate)) is not None]


def run_verdict(counts: Counter[tuple[str, str]], gate: frozenset[Level], *, failed_cases: int = 0,
                suite_errors: int = 0, missing: int = 0) -> RunVerdict:
    """The run's verdict, from the same per-level verdicts as :func:`lines`.

    ``failed_cases``: cases the run failed (a case can fail on a gated check it recorded, or on a hang);
    ``suite_errors``: cases that hit a bug of the suite itself (then nothing is decided); ``missing``:
    collected cases without a result (a lost case is never a pass).
    """
    gated = [level for level in Level if level in gate]
    names = {verdict: ", ".join(level.value for level in gated if level_verdict(level, counts, gate) == verdict)
             for verdict in (CONFORMANT, NOT_CONFORMANT, NOT_JUDGED)}
    rest = "".join(f"; {verdict} at {names[verdict]}" for verdict in (CONFORMANT, NOT_JUDGED)
                   if names[verdict])
    if suite_errors:
        return RunVerdict(NOT_DECIDED, f"{NOT_DECIDED} at {', '.join(level.value for level in gated)}: "
                                       f"{suite_errors} case(s) hit an error of the suite itself")
    if names[NOT_CONFORMANT] or failed_cases or missing:
        failing = names[NOT_CONFORMANT] or ", ".join(level.value for level in gated)
        lost = f", {missing} collected case(s) without a result" if missing else ""
        return RunVerdict(NOT_CONFORMANT, f"{NOT_CONFORMANT} at {failing}: {failed_cases} case(s) failed{lost}{rest}")
    if not names[CONFORMANT]:
        return RunVerdict(NOT_JUDGED,
                          f"{NOT_JUDGED.upper()}: no check of {', '.join(level.value for level in gated)} was judged")
    return RunVerdict(CONFORMANT, f"{CONFORMANT.upper()} at {names[CONFORMANT]}"
                      + (f"; {NOT_JUDGED} at {names[NOT_JUDGED]}" if names[NOT_JUDGED] else ""))
