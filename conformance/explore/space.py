"""How a dimension of the space is drawn, made simpler and counted: the pieces every kind of spec builds its space from.

A dimension is one field of a spec: a draw from a seeded ``random.Random``,
the one-step-simpler values of a value, simplest first, and the report
buckets its values fall in.  Drawing, shrinking and counting read the same
lines (a :class:`Space`), so a new dimension (a new job field) is one line in
a kind's space and one field of its spec.  Every bucket a dimension names is
one a draw reaches -- at its weight, or its size range's share -- so a report
(and the unit test of what a night covers) can hold each to a floor.

Small sizes most of the time (cases per second), big ones sometimes (where
kernels switch algorithm), odd and prime sizes often (tail tiles).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

Case = TypeVar("Case")


@dataclass(frozen=True)
class Weighted:
    """One of ``values``, drawn with ``weights``; each value is its own report bucket."""

    values: tuple[Any, ...]
    weights: tuple[float, ...]

    def __call__(self, rng: random.Random) -> Any:
        return rng.choices(self.values, self.weights)[0]

    def bucket(self, value: Any) -> str:
        return str(value)

    @property
    def buckets(self) -> tuple[str, ...]:
        return tuple(map(str, self.values))


def weighted(values: Sequence[Any], weights: Sequence[float]) -> Weighted:
    """Draw one of ``values`` with ``weights``."""
    return Weighted(tuple(values), tuple(weights))


#: How often a size falls in its small, medium and large range.
SIZE_SHARES = (80.0, 16.0, 4.0)


@dataclass(frozen=True)
class Sized:
    """A size: in ``1..small`` most of the time, ``small+1..medium`` sometimes, ``medium+1..large`` rarely
    (``shares``); each range is a report bucket, drawn at its share."""

    small: int
    medium: int
    large: int
    shares: tuple[float, float, float] = SIZE_SHARES

    def __call__(self, rng: random.Random) -> int:
        low, high = rng.choices(((1, self.small), (self.small + 1, self.medium), (self.medium + 1, self.large)),
                                self.shares)[0]
        return rng.randint(low, high)

    def bucket(self, value: int) -> str:
        """``<=small``, ``<=medium`` or ``>medium`` (a neighbour or a mutation past ``large`` too)."""
        return f"<={self.small}" if value <= self.small else f"<={self.medium}" if value <= self.medium \
            else f">{self.medium}"

    @property
    def buckets(self) -> tuple[str, ...]:
        return f"<={self.small}", f"<={self.medium}", f">{self.medium}"


def size(small: int, medium: int, large: int, shares: tuple[float, float, float] = SIZE_SHARES) -> Sized:
    """Mostly ``1..small``, sometimes up to ``medium``, rarely up to ``large``."""
    return Sized(small, medium, large, shares)


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


#: A dimension's value where it does not apply: counted in no bucket.
NOT_APPLICABLE = object()


@dataclass(frozen=True)
class Dimension:
    """One field of a spec: how it is drawn, its simpler values, how a report buckets it.

    ``bucket`` and ``buckets`` default to the draw's own (a :class:`Weighted` value's name, a :class:`Sized`
    range); ``absent`` is the value a spec holds where the dimension does not apply (no bucket counts it).
    """

    name: str
    draw: Callable[[random.Random], Any]
    simpler: Callable[[Any], list[Any]]
    bucket: Callable[[Any], str] | None = None
    buckets: tuple[str, ...] = ()
    absent: Any = NOT_APPLICABLE

    def bucket_of(self, value: Any) -> str | None:
        """The report bucket of ``value`` (None where the dimension does not apply)."""
        if self.absent is not NOT_APPLICABLE and value == self.absent:
            return None
        if self.bucket is not None:
            return self.bucket(value)
        return str(getattr(self.draw, "bucket", str)(value))

    def every_bucket(self) -> tuple[str, ...]:
        """Every bucket a draw reaches."""
        return self.buckets or tuple(getattr(self.draw, "buckets", ()))


class Space:
    """The dimensions of a spec (or of one call of it), in order: what drawing, shrinking and counting read."""

    def __init__(self, *dimensions: Dimension) -> None:
        self.dimensions = dimensions

    def __iter__(self) -> Iterator[Dimension]:
        return iter(self.dimensions)

    def draw(self, rng: random.Random) -> dict[str, Any]:
        """One value per dimension, in their order (the same seed, the same values)."""
        return {d.name: d.draw(rng) for d in self.dimensions}

    def simpler(self, case: Case) -> Iterator[Case]:
        """``case`` with one field one step simpler, simplest first (``case`` a frozen dataclass)."""
        for d in self.dimensions:
            for value in d.simpler(getattr(case, d.name)):
                yield replace(case, **{d.name: value})  # type: ignore[type-var]

    def tags(self, case: Any) -> list[str]:
        """``dimension=bucket`` of each dimension that applies to ``case`` (the explored counts per dimension)."""
        found = ((d.name, d.bucket_of(getattr(case, d.name))) for d in self.dimensions)
        return [f"{name}={bucket}" for name, bucket in found if bucket is not None]

    def buckets(self) -> dict[str, tuple[str, ...]]:
        """Every dimension's buckets a draw reaches."""
        return {d.name: d.every_bucket() for d in self.dimensions}


def valid_neighbours(case: Case, candidates: Iterable[Case],
                     fit: Callable[[Case], Case] = lambda c: c) -> Iterator[Case]:
    """Each of ``candidates`` made runnable by ``fit``, once, if valid and not ``case`` itself (simplest first)."""
    seen = {case}
    for candidate in map(fit, candidates):
        if candidate not in seen and not candidate.invalid():  # type: ignore[attr-defined]
            seen.add(candidate)
            yield candidate


def round_to(value: int, step: int, up: bool) -> int:
    """``value`` rounded to a multiple of ``step`` (up or down), at least ``step``."""
    return max(step, -(-value // step) * step if up else value // step * step)
