"""Cost curves: time in microseconds as a function of one size, fitted or measured.

The MC2 tiling method plans chunk sizes from two fitted curves: the matmul time
of ``m`` rows, linear in ``m`` (:func:`fit_matmul`), and the collective time,
fitted against the payload size ``x`` in MB (``2**20`` bytes, as the MC2 method
computes ``384*8192*2/1024/1024 = 6``): quadratic below a breakpoint (8 MB)
where latency dominates, linear at and above it (:func:`fit_comm`).  The
functions here know nothing of rows or bytes; :mod:`coc_shared.cost_model`
evaluates them for ``m`` rows of a shape.

Every curve also answers the inverse question ``solve(t)``: the smallest
``x >= 0`` whose cost reaches ``t`` (``math.inf`` if it never does).  For the
increasing curves that measurements produce this is the exact inverse; the
"smallest x reaching t" definition keeps it well defined at the jump a
piecewise fit may have at its breakpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = [
    "MB",
    "SEED_COMM_BREAKPOINT_MB",
    "CostCurve",
    "CostFunction",
    "LinearCost",
    "MeasuredCurve",
    "PiecewiseQuadLinearCost",
    "fit_comm",
    "fit_matmul",
]

#: Bytes in the MC2 method's "MB".
MB = 1024 * 1024
#: The MC2 method's breakpoint between its quadratic and linear comm pieces, in MB.
SEED_COMM_BREAKPOINT_MB = 8.0


class CostCurve(Protocol):
    """Time in microseconds as a function of one non-negative size."""

    def __call__(self, x: float, /) -> float: ...

    def solve(self, t: float, /) -> float:
        """Smallest ``x >= 0`` with ``self(x) >= t``; ``math.inf`` if none."""
        ...


@dataclass(frozen=True)
class LinearCost:
    """``t = slope*x + intercept``."""

    slope: float
    intercept: float

    def __call__(self, x: float) -> float:
        return self.slope * x + self.intercept

    def solve(self, t: float) -> float:
        if self(0.0) >= t:
            return 0.0
        if self.slope <= 0:
            return math.inf
        return (t - self.intercept) / self.slope

    def rescaled(self, ratio: float) -> LinearCost:
        """The function ``x -> self(ratio*x)``."""
        return LinearCost(self.slope * ratio, self.intercept)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "linear", "slope": self.slope, "intercept": self.intercept}


@dataclass(frozen=True)
class PiecewiseQuadLinearCost:
    """``a*x**2 + b*x + c`` below ``breakpoint``, ``slope*x + intercept`` at/above.

    Small collectives are latency dominated and curve; large ones are bandwidth
    bound and straight, hence the two pieces.
    """

    breakpoint: float
    below: tuple[float, ...]  # (a, b, c)
    above: tuple[float, ...]  # (slope, intercept)

    def __post_init__(self) -> None:
        object.__setattr__(self, "below", tuple(float(v) for v in self.below))
        object.__setattr__(self, "above", tuple(float(v) for v in self.above))
        if len(self.below) != 3 or len(self.above) != 2:
            raise ValueError("below needs [a, b, c] and above needs [slope, intercept]")

    def __call__(self, x: float) -> float:
        if x < self.breakpoint:
            a, b, c = self.below
            return (a * x + b) * x + c
        return self._linear(x)

    def _linear(self, x: float) -> float:
        slope, intercept = self.above
        return slope * x + intercept

    def solve(self, t: float) -> float:
        if self(0.0) >= t:
            return 0.0
        # f(0) < t, and the quadratic piece is continuous on [0, breakpoint):
        # its first crossing of t is its smallest root there.
        a, b, c = self.below
        in_piece = [r for r in _real_roots(a, b, c - t) if 0.0 <= r < self.breakpoint]
        if in_piece:
            return min(in_piece)
        start = max(self.breakpoint, 0.0)
        if self._linear(start) >= t:  # t falls in the jump at the breakpoint
            return start
        slope, intercept = self.above
        return (t - intercept) / slope if slope > 0 else math.inf

    def rescaled(self, ratio: float) -> PiecewiseQuadLinearCost:
        """The function ``x -> self(ratio*x)``."""
        a, b, c = self.below
        slope, intercept = self.above
        return PiecewiseQuadLinearCost(
            breakpoint=self.breakpoint / ratio,
            below=(a * ratio * ratio, b * ratio, c),
            above=(slope * ratio, intercept),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "piecewise_quad_linear",
            "breakpoint": self.breakpoint,
            "below": list(self.below),
            "above": list(self.above),
        }


@dataclass(frozen=True)
class MeasuredCurve:
    """A cost curve through measured ``(rows, time)`` points, linear in between.

    A :class:`CostCurve`, so the pipeline model runs on exactly the costs
    measured (one point: proportional to rows); ``--coc-parallel-num auto``
    and the perf protocol use it where a fit could go negative between noisy
    points.
    """

    rows: tuple[float, ...]
    times: tuple[float, ...]

    @classmethod
    def of(cls, points: Mapping[int, float]) -> MeasuredCurve:
        if not points:
            raise ValueError("a measured curve needs at least one point")
        ordered = sorted(points.items())
        return cls(tuple(float(r) for r, _ in ordered), tuple(float(t) for _, t in ordered))

    def __call__(self, x: float) -> float:
        if len(self.rows) == 1:
            return self.times[0] * x / self.rows[0]
        return float(np.interp(x, self.rows, self.times))

    def solve(self, t: float) -> float:
        return float(np.interp(t, np.maximum.accumulate(self.times), self.rows))


def _real_roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of ``a*x**2 + b*x + c``, stable for tiny or zero ``a``."""
    if a == 0:
        return [-c / b] if b != 0 else []
    disc = b * b - 4 * a * c
    if disc < 0:
        return []
    q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
    roots = [c / q] if q != 0 else [0.0]
    with np.errstate(over="ignore"):
        far = np.float64(q) / np.float64(a)  # may overflow to inf for tiny a: no root there
    return roots + [float(far)]


CostFunction = LinearCost | PiecewiseQuadLinearCost


def fit_matmul(ms: Sequence[float], times: Sequence[float]) -> LinearCost:
    """Least-squares line through measured (rows, us) points."""
    x, y = _points(ms, times, minimum=2)
    slope, intercept = np.polyfit(x, y, 1)
    return LinearCost(float(slope), float(intercept))


def fit_comm(
    nbytes: Sequence[float],
    times: Sequence[float],
    breakpoint_mb: float | None = SEED_COMM_BREAKPOINT_MB,
) -> CostFunction:
    """Fit collective time against payload size in MB, as the MC2 method does.

    With a breakpoint: a quadratic through the points below it (at least 3) and
    a line through the points at or above it (at least 2).  ``None`` fits one
    line through all points.
    """
    x, y = _points(nbytes, times, minimum=2)
    x = x / MB
    if breakpoint_mb is None:
        slope, intercept = np.polyfit(x, y, 1)
        return LinearCost(float(slope), float(intercept))
    low = x < breakpoint_mb
    if low.sum() < 3 or (~low).sum() < 2:
        raise ValueError(
            f"a piecewise fit at {breakpoint_mb} MB needs >= 3 points below and >= 2 "
            f"at/above it, got {int(low.sum())} and {int((~low).sum())}; "
            "measure more sizes or pass breakpoint_mb=None for one line"
        )
    below = np.polyfit(x[low], y[low], 2)
    above = np.polyfit(x[~low], y[~low], 1)
    return PiecewiseQuadLinearCost(float(breakpoint_mb), tuple(below), tuple(above))


def _points(xs: Sequence[float], ys: Sequence[float], minimum: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"need two 1-D sequences of equal length, got {x.shape} and {y.shape}")
    if len(x) < minimum:
        raise ValueError(f"need at least {minimum} measurements, got {len(x)}")
    return x, y
