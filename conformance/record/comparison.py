"""What one numeric comparison found, as the record keeps it: the stats, and the arrays a report draws.

:func:`conformance.judge.numerics.compare` makes one against its error bound; the case's evidence
(:mod:`conformance.record.evidence`) keeps it and the report draws it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from conformance.contract.equality import row_ranges


@dataclass(frozen=True)
class ErrorStats:
    """How far one tensor is from the truth, and how close to its bound."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    rel_l2: float
    serial_max_abs: float
    serial_rel_l2: float
    worst_ratio: float  # max over elements of |out - truth| / bound (<= 1 passes)
    violations: int
    first_violation: tuple[int, ...] | None
    reduction_len: int
    #: Rows (of the tensor's 2-D view: leading dims flattened) holding a violation.
    bad_rows: tuple[int, ...] = ()
    rows: int = 0

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        text = (f"{self.name} [{self.dtype} {list(self.shape)}]: max_abs={self.max_abs:.3e} "
                f"max_rel={self.max_rel:.3e} rel_l2={self.rel_l2:.3e} (serial max_abs="
                f"{self.serial_max_abs:.3e} rel_l2={self.serial_rel_l2:.3e}) worst/bound="
                f"{self.worst_ratio:.3g} violations={self.violations}")
        if self.bad_rows:
            text += f" in rows {row_ranges(self.bad_rows)} of {self.rows}"
        return text


@dataclass(frozen=True)
class Comparison:
    """The stats plus the arrays a report needs (|diff| and the bound)."""

    stats: ErrorStats
    abs_diff: np.ndarray
    bound: np.ndarray
