"""How a dimension of the space is drawn and made simpler: the pieces every kind of spec builds its space from.

A dimension is one field of a spec: a draw from a seeded ``random.Random``
and the one-step-simpler values of a value, simplest first.  Drawing and
shrinking read the same lines, so a new dimension (a new job field) is one
line in a kind's space and one field of its spec.

Small sizes most of the time (cases per second), big ones sometimes (where
kernels switch algorithm), odd and prime sizes often (tail tiles).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

Case = TypeVar("Case")


def weighted(values: Sequence[Any], weights: Sequence[float]) -> Callable[[random.Random], Any]:
    """Draw one of ``values`` with ``weights``."""
    return lambda rng: rng.choices(values, weights)[0]


def size(small: int, medium: int, large: int) -> Callable[[random.Random], int]:
    """Mostly ``1..small``, sometimes up to ``medium``, rarely up to ``large``."""
    def draw(rng: random.Random) -> int:
        top = rng.choices((small, medium, large), (80, 16, 4))[0]
        return rng.randint(1, top)
    return draw


def smaller_ints(value: int) -> list[int]:
    """Smaller values, simplest first: 1, then ``value`` minus halving steps (odd and even steps, so parity is kept)."""
    steps: set[int] = set()
    step = value - 1
    while step >= 1:
        steps.update((step, step - 1) if step > 1 else (step,))
        step //= 2
    return sorted({value - s for s in steps if 0 < value - s < value})


def towards(*simplest: Any) -> Callable[[Any], list[Any]]:
    """A value's simpler ones: those of ``simplest`` (in order) listed before it."""
    return lambda value: list(simplest[:simplest.index(value)]) if value in simplest else list(simplest)


def nothing_simpler(value: Any) -> list[Any]:
    """A dimension the shrinker leaves as it is (an op: another op is another case, not a simpler one)."""
    return []


def size_bucket(value: int) -> str:
    """How a report counts a size: ``<=16``, ``<=128``, ``<=1024``, ``inf``."""
    return next(f"<={top}" for top in (16, 128, 1024) if value <= top) if value <= 1024 else "inf"


@dataclass(frozen=True)
class Dimension:
    """One field of a spec: how it is drawn, its simpler values, how a report buckets it."""

    name: str
    draw: Callable[[random.Random], Any]
    simpler: Callable[[Any], list[Any]]
    bucket: Callable[[Any], str] = str


def draw_fields(rng: random.Random, dimensions: Iterable[Dimension]) -> dict[str, Any]:
    """One value per dimension, in their order (the same seed, the same values)."""
    return {d.name: d.draw(rng) for d in dimensions}


def simpler_fields(case: Case, dimensions: Iterable[Dimension]) -> Iterator[Case]:
    """``case`` with one field of ``dimensions`` one step simpler, simplest first (``case`` a frozen dataclass)."""
    for d in dimensions:
        for value in d.simpler(getattr(case, d.name)):
            yield replace(case, **{d.name: value})  # type: ignore[type-var]


def field_tags(case: Any, dimensions: Iterable[Dimension]) -> list[str]:
    """``dimension=bucket`` of each of ``dimensions`` (the explored counts per dimension)."""
    return [f"{d.name}={d.bucket(getattr(case, d.name))}" for d in dimensions]


def valid_neighbours(case: Case, candidates: Iterable[Case],
                     fit: Callable[[Case], Case] = lambda c: c) -> Iterator[Case]:
    """Each of ``candidates`` made runnable by ``fit``, once, if valid and not ``case`` itself (simplest first)."""
    seen = {case}
    for candidate in map(fit, candidates):
        if candidate not in seen and not candidate.invalid():  # type: ignore[attr-defined]
            seen.add(candidate)
            yield candidate
