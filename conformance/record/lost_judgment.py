"""A loss of judgment: a case, or a check, that the baseline run judged and the current run did not.

Skipped, not offered, not judged, stopped by an error of the suite's own, or
missing: a failure that became a skip is no fix, and neither is a pass that
did.  A loss the current run's expectations file names is kept with that
entry (:attr:`Loss.expected`), which says it may happen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conformance.record.expected import SKIP, UNJUDGED, Expectation
from conformance.record.failures import HANG, SUITE_ERROR
from conformance.record.verdicts import JUDGED, NOT_JUDGED, NOT_OFFERED, outcome_of

#: What a case that is not in a run counts as.
MISSING = "missing"


@dataclass(frozen=True)
class Loss:
    """A judgment the baseline made that the current run did not: a whole case, or one check of it."""

    case: str
    check: str  #: the check's name ("" when the case had no check: it failed before recording one)
    level: str
    before: str  #: the baseline's outcome of the check (or of the case)
    after: str  #: the current one: skipped, not offered, not judged, error (the suite's), missing
    why: str  #: why the current run did not judge it (its skip reason, its message)
    expected: Expectation | None = None  #: the current run's expectations entry saying it may happen


def judged(case: Mapping[str, Any]) -> bool:
    """Whether a run judged ``case``: it passed or failed (known and not gated are failures), or hung -- not
    skipped, not judged, nor stopped by an error of the suite's own."""
    category = (case.get("failure") or {}).get("category")
    return case.get("outcome") in ("passed", "failed", "known", "not-gated") or \
        (case.get("outcome") == "error" and category != SUITE_ERROR)


def lost_judgment(before: Mapping[str, Any], now: Mapping[str, Any] | None,
                  expectations: Sequence[Expectation] = ()) -> list[Loss]:
    """What the baseline's ``before`` judged that the current run's record of the same case (``now``; None: not in
    the run) does not: every judged check when the whole case lost its judgment, else each judged check now
    unjudged or gone (but for a hang, where the checks after it never ran, and an exploration's sample)."""
    if not judged(before):
        return []
    checks = [c for c in before.get("checks", ()) if outcome_of(c) in JUDGED]
    if now is None or not judged(now):
        after, why = _unjudged(now)
        whole = checks or [{"name": "", "level": "", "outcome": before["outcome"]}]  # it failed before any check
        return [_loss(before, c, outcome_of(c), after, why, now, expectations) for c in whole]
    if (now.get("failure") or {}).get("category") == HANG:
        return []
    current = {c["name"]: c for c in now.get("checks", ())}
    sampled = "explore" in now  # an exploration records the checks of what it drew
    losses = []
    for check in checks:
        there = current.get(check["name"])
        if there is None and not sampled:
            losses.append(_loss(before, check, outcome_of(check), MISSING, "the case no longer records this check",
                                now, expectations))
        elif there is not None and outcome_of(there) not in JUDGED:
            losses.append(_loss(before, check, outcome_of(check), outcome_of(there), str(there.get("message", "")),
                                now, expectations))
    return losses


def _unjudged(now: Mapping[str, Any] | None) -> tuple[str, str]:
    """What an unjudged case came out as (``not offered`` when every check it carries says so), and why."""
    if now is None:
        return MISSING, "not in the current run"
    outcomes = {outcome_of(c) for c in now.get("checks", ())}
    after = NOT_OFFERED if outcomes == {NOT_OFFERED} else str(now["outcome"])
    why = now.get("skip_reason") or (now.get("failure") or {}).get("message") or \
        next((str(c.get("message", "")) for c in now.get("checks", ()) if outcome_of(c) in (NOT_JUDGED, NOT_OFFERED)),
             "")
    return after, first_line_of(str(why))


def _loss(before: Mapping[str, Any], check: Mapping[str, Any], was: str, after: str, why: str,
          now: Mapping[str, Any] | None, expectations: Sequence[Expectation]) -> Loss:
    cid = str(before["id"])
    expected = next((e for e in expectations if e.matches(cid) and (
        (e.outcome == UNJUDGED and (e.whole_case or (check["name"] and e.covers(check))))
        or (e.outcome == SKIP and e.whole_case and now is not None and now["outcome"] == "skipped"))), None)
    return Loss(cid, str(check["name"]), str(check["level"]), was, after, first_line_of(why), expected)


def first_line_of(text: str) -> str:
    """The first line of ``text`` (at most 200 characters)."""
    lines = text.strip().splitlines()
    return (lines[0] if lines else "")[:200]
