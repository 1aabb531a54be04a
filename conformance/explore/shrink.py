"""Shrinking: from a failing case to one whose every one-step-simpler neighbour passes.

Greedy and deterministic: the first neighbour (simplest first) that still
fails the *same* way becomes the case, until none does -- then the case is
minimal with respect to the space's steps, and that is proved by having run
each neighbour.  A deadline bounds the search; a case cut short says so.
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
    minimal: bool  #: every neighbour was run and passed (False: the deadline came first)
    steps: int  #: how many times a simpler failing case was taken
    tried: int  #: cases judged while shrinking


def shrink(case: Case, fails: Callable[[Case], bool], neighbours: Callable[[Case], Iterable[Case]],
           deadline: float, clock: Callable[[], float] = time.monotonic) -> Shrunk[Case]:
    """Shrink ``case`` (which fails) along ``neighbours`` while ``fails`` holds, until ``deadline`` (``clock``)."""
    known: dict[Case, bool] = {case: True}
    steps = 0
    while True:
        for candidate in neighbours(case):
            if clock() >= deadline:
                return Shrunk(case, False, steps, len(known) - 1)
            if candidate not in known:
                known[candidate] = fails(candidate)
            if known[candidate]:
                case, steps = candidate, steps + 1
                break
        else:
            return Shrunk(case, True, steps, len(known) - 1)
