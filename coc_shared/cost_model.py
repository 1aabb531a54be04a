"""Cost models of a chunked matmul + collective: row costs, and the cost file that holds their fits.

Row costs (:class:`MatmulCost`, :class:`CommCost`) evaluate a fitted
:mod:`coc_shared.cost_curves` function for ``m`` rows of a given shape; both
satisfy :class:`~coc_shared.cost_curves.CostCurve`, which is all the planner and
the pipeline simulator need.

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
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from coc_shared.cost_curves import MB, CostFunction, LinearCost, PiecewiseQuadLinearCost
from coc_shared.json_file import read_json

COST_SCHEMA_VERSION = 1


class CostFileError(ValueError):
    """A cost file that cannot be read or does not follow the schema (the message names the key)."""


#: Cost fits of the MC2 best-practice worked example (MatmulAllReduce).
SEED_COSTS_FILE = Path(__file__).with_name("data") / "seed_mc2_costs.json"


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
