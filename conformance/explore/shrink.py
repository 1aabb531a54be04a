"""Shrinking: from a failing case to one whose every one-step-simpler neighbour passes.

Greedy and deterministic: the first neighbour (simplest first) that still
fails the *same* way becomes the case, until none does.  The case is
*minimal* -- with respect to the space's steps -- only when every neighbour
ran and recorded no failure; a neighbour that proves nothing (it was not
judged, failed another way, or is out of the run's reach) leaves it minimal
*within reach*, with the reasons.  A deadline bounds the search; a case cut
short says so.
Each spec is judged at most once (results are cached), and the shrinker
knows nothing of ranks: ``fails`` is any predicate, so it is tested on
synthetic ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

Case = TypeVar("Case", bound=Hashable)


@dataclass(frozen=True)
class Shrunk(Generic[Case]):
    """The smallest failing case found, whether it is proved minimal, and what the search cost."""

    case: Case
    minimal: bool  #: every neighbour ran and recorded no failure (False: see ``unproved``, or the deadline came)
    steps: int  #: how many times a simpler failing case was taken
    tried: int  #: cases judged while shrinking
    unproved: tuple[str, ...] = ()  #: why some neighbour of ``case`` proves nothing ("minimal within reach")
    cut_short: bool = False  #: the deadline came before every neighbour was tried


def shrink(case: Case, fails: Callable[[Case], bool | str], neighbours: Callable[[Case], Iterable[Case]],
           deadline: float, clock: Callable[[], float] = time.monotonic) -> Shrunk[Case]:
    """Shrink ``case`` (which fails) along ``neighbours`` while ``fails`` holds, until ``deadline`` (``clock``).

    ``fails(candidate)`` is True when it fails the same way, False when it ran
    and recorded no failure, or a reason why it proves nothing either way.
    """
    known: dict[Case, bool | str] = {case: True}
    steps = 0
    while True:
        unproved: list[str] = []
        for candidate in neighbours(case):
            if clock() >= deadline:
                return Shrunk(case, False, steps, len(known) - 1, tuple(unproved), cut_short=True)
            if candidate not in known:
                known[candidate] = fails(candidate)
            verdict = known[candidate]
            if verdict is True:
                case, steps = candidate, steps + 1
                break
            if verdict is not False:
                unproved.append(str(verdict))
        else:
            return Shrunk(case, not unproved, steps, len(known) - 1, tuple(unproved))
