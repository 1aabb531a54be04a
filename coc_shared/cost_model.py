"""Cost models of a chunked matmul + collective, fitted from measurements.

The MC2 tiling method plans chunk sizes from two fitted curves: the matmul time
of ``m`` rows, ``CostMM(m)``, and the collective time of an ``m``-row payload,
``CostComm(m)``.  Following the MC2 method, the matmul time is linear in ``m`` and the
collective time is fitted against the payload size ``x`` in MB (``2**20``
bytes, as the MC2 method computes ``384*8192*2/1024/1024 = 6``): quadratic below a
breakpoint (8 MB) where latency dominates, linear at and above it.

Two layers keep the units apart:

* cost *functions* of a scalar (:class:`LinearCost`,
  :class:`PiecewiseQuadLinearCost`) know nothing of rows or bytes;
* row costs (:class:`MatmulCost`, :class:`CommCost`) evaluate a function for
  ``m`` rows of a given shape.  Both satisfy :class:`CostCurve`, which is all
  the planner and the pipeline simulator need.

Every curve also answers the inverse question ``solve(t)``: the smallest
``x >= 0`` whose cost reaches ``t`` (``math.inf`` if it never does).  For the
increasing curves that measurements produce this is the exact inverse; the
"smallest x reaching t" definition keeps it well defined at the jump a
piecewise fit may have at its breakpoint.

Cost file (JSON, ``"schema": 1``)::

    {
      "schema": 1,
      "meta": {...},                       # optional, free-form provenance
      "matmul": {
        "x": "rows",                       # time of m rows, in us
        "k": 3072, "n": 8192,              # shape the matmul was MEASURED at
        "kind": "linear", "slope": 0.196, "intercept": 0.0
      },
      "comm": {
        "x": "MB",                         # payload m*N*dtype_size / 2**20
        "kind": "piecewise_quad_linear",
        "breakpoint": 8.0,                 # MB; quadratic below, linear at/above
        "below": [a, b, c],                # t = a*x**2 + b*x + c
        "above": [slope, intercept]        # t = slope*x + intercept
      }
    }

Either section may use either ``kind`` (``"linear"`` takes ``slope`` and
``intercept``; ``"piecewise_quad_linear"`` takes ``breakpoint``, ``below``,
``above``).  Times are microseconds.  The comm fit is per payload size, so it
holds for any ``N`` and dtype (for the collective, world size and interconnect it
was measured on).  The matmul fit holds only for the ``(k, n)`` it was measured
at; :meth:`MatmulCost.for_shape` extrapolates to another shape at equal FLOPs
per row, which is an approximation - measure the real shape when it matters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from coc_shared.json_file import read_json

COST_SCHEMA_VERSION = 1
#: Bytes in the MC2 method's "MB".
MB = 1024 * 1024
#: The MC2 method's breakpoint between its quadratic and linear comm pieces, in MB.
SEED_COMM_BREAKPOINT_MB = 8.0
#: Cost fits of the MC2 best-practice worked example (MatmulAllReduce).

class CostFileError(ValueError):
    """A cost file that cannot be read or does not follow the schema (the message names the key)."""


SEED_COSTS_FILE = Path(__file__).with_name("data") / "seed_mc2_costs.json"


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


@dataclass(frozen=True)
class MatmulCost:
    """Matmul time of ``m`` rows of ``[m, k] @ [k, n]``: ``fit(m)``."""

    fit: CostFunction
    k: int
    n: int

    def __call__(self, m: float) -> float:
        return self.fit(m)

    def solve(self, t: float) -> float:
        return self.fit.solve(t)

    def for_shape(self, k: int, n: int) -> MatmulCost:
        """Extrapolate to ``(k, n)`` assuming time depends on FLOPs only.

        ``m`` rows at ``(k, n)`` cost what ``m*k*n/(self.k*self.n)`` rows cost
        at the measured shape.
        """
        if (k, n) == (self.k, self.n):
            return self
        return MatmulCost(self.fit.rescaled(k * n / (self.k * self.n)), k, n)


@dataclass(frozen=True)
class CommCost:
    """Collective time of ``m`` rows of width ``n``: ``fit(m*n*dtype_size / MB)``."""

    fit: CostFunction
    n: int
    dtype_size: int

    @property
    def mb_per_row(self) -> float:
        return self.n * self.dtype_size / MB

    def __call__(self, m: float) -> float:
        return self.fit(m * self.mb_per_row)

    def solve(self, t: float) -> float:
        return self.fit.solve(t) / self.mb_per_row


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


@dataclass(frozen=True)
class CostModels:
    """The contents of a cost file: a matmul fit at one shape and a comm fit in MB."""

    matmul: MatmulCost
    comm: CostFunction
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    def bind(self, k: int, n: int, dtype_size: int) -> tuple[MatmulCost, CommCost]:
        """Row costs for a ``[m, k] @ [k, n]`` matmul whose output is communicated."""
        return self.matmul.for_shape(k, n), CommCost(self.comm, n, dtype_size)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": COST_SCHEMA_VERSION}
        if self.meta:
            doc["meta"] = dict(self.meta)
        doc["matmul"] = {"x": "rows", "k": self.matmul.k, "n": self.matmul.n, **self.matmul.fit.to_dict()}
        doc["comm"] = {"x": "MB", **self.comm.to_dict()}
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> CostModels:
        """Parse a cost document; every defect raises :class:`CostFileError`."""
        if not isinstance(doc, Mapping):
            raise CostFileError("cost file must hold a JSON object")
        if doc.get("schema") != COST_SCHEMA_VERSION:
            raise CostFileError(
                f"cost file schema {doc.get('schema')!r} is not supported (expected {COST_SCHEMA_VERSION})"
            )
        _expect_keys(doc, "cost file", required={"schema", "matmul", "comm"}, optional={"meta"})
        meta = doc.get("meta", {})
        if not isinstance(meta, Mapping):
            raise CostFileError("cost file 'meta' must be an object")
        mm = _section(doc, "matmul", x="rows", extra={"k", "n"})
        k, n = mm["k"], mm["n"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (k, n)):
            raise CostFileError(f"cost file matmul k and n must be positive integers, got {k!r}, {n!r}")
        comm = _section(doc, "comm", x="MB", extra=set())
        return cls(MatmulCost(_function(mm, "matmul"), k, n), _function(comm, "comm"), meta)


_FUNCTION_KEYS = {
    "linear": {"slope", "intercept"},
    "piecewise_quad_linear": {"breakpoint", "below", "above"},
}


def _expect_keys(
    obj: Mapping[str, Any], where: str, required: AbstractSet[str], optional: AbstractSet[str] = frozenset()
) -> None:
    missing = required - obj.keys()
    unknown = obj.keys() - required - optional
    problems = ([f"missing {sorted(missing)}"] if missing else []) + (
        [f"unknown {sorted(unknown)}"] if unknown else []
    )
    if problems:
        raise CostFileError(f"{where}: keys " + ", ".join(problems))


def _section(doc: Mapping[str, Any], name: str, x: str, extra: set[str]) -> Mapping[str, Any]:
    sec = doc[name]
    if not isinstance(sec, Mapping):
        raise CostFileError(f"cost file '{name}' must be an object")
    kind = sec.get("kind")
    if kind not in _FUNCTION_KEYS:
        raise CostFileError(f"cost file {name}.kind must be one of {sorted(_FUNCTION_KEYS)}, got {kind!r}")
    _expect_keys(sec, f"cost file '{name}'", required={"x", "kind", *extra, *_FUNCTION_KEYS[kind]})
    if sec["x"] != x:
        raise CostFileError(f"cost file {name}.x must be {x!r}, got {sec['x']!r}")
    return sec


def _function(sec: Mapping[str, Any], name: str) -> CostFunction:
    try:
        if sec["kind"] == "linear":
            return LinearCost(_number(sec["slope"]), _number(sec["intercept"]))
        below = tuple(_number(v) for v in sec["below"])
        above = tuple(_number(v) for v in sec["above"])
        return PiecewiseQuadLinearCost(_number(sec["breakpoint"]), below, above)
    except (TypeError, ValueError) as exc:
        raise CostFileError(f"cost file '{name}': {exc}") from None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def load_costs(path: str | Path) -> CostModels:
    """Read a cost file; unreadable or malformed files raise :class:`CostFileError`."""
    return CostModels.from_dict(read_json(path, CostFileError, "cost file"))


def save_costs(models: CostModels, path: str | Path) -> None:
    Path(path).write_text(json.dumps(models.to_dict(), indent=2) + "\n", encoding="utf-8")
