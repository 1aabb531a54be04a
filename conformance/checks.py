"""Assertions shared by the suite: numerics, bitwise equality, expected errors.

Each raises a :class:`~conformance.errors.CheckFailure` subclass (so the
report files it under the right category) and attaches its evidence to the
report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conformance import numerics
from conformance.errors import DeterminismViolation, NumericMismatch, WrongError


def _report() -> Any:
    from conformance import reporting  # lazily: it imports allure

    return reporting


def check_close(name: str, out: Any, truth: Any, serial: Any, envelope: tuple[np.ndarray, int],
                dtype: Any, *, roundings: int) -> numerics.ErrorStats:
    """``out`` within the SPEC §6 bound of float64 ``truth`` (see :mod:`conformance.numerics`).

    ``envelope`` is ``(|A| @ |B|, K)``; ``roundings`` the R of the bound.
    """
    magnitude, reduction_len = envelope
    comparison = numerics.compare(name, out, truth, serial, magnitude=magnitude,
                                  reduction_len=reduction_len, roundings=roundings, dtype=dtype)
    _report().attach_comparison(comparison, failed=not comparison.stats.ok)
    if not comparison.stats.ok:
        where = comparison.stats.first_violation
        detail = ""
        if where is not None:
            detail = (f"; first at {list(where)}: got {_f(out, where):.6g}, float64 "
                      f"{_f(truth, where):.6g}, serial {_f(serial, where):.6g}, bound "
                      f"{comparison.bound[where]:.3g}")
        raise NumericMismatch(comparison.stats.summary() + detail)
    return comparison.stats


def _f(a: Any, index: tuple[int, ...]) -> float:
    return float(numerics._f64(a)[index])


def check_bitwise_equal(name: str, runs: Sequence[Any], what: str = "run") -> None:
    """Every tensor in ``runs`` is bitwise identical to the first."""
    first = runs[0]
    for i, other in enumerate(runs[1:], start=1):
        if not _bitwise_equal(first, other):
            raise DeterminismViolation(f"{name}: {what} {i} differs bitwise from {what} 0 "
                                       f"({_difference(first, other)})")


def _bitwise_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
            return False
        # Compare bits, so -0.0 vs 0.0 differs and NaN equals the same NaN.
        return bool(torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                b.contiguous().reshape(-1).view(torch.uint8)))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(
            _bitwise_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            _bitwise_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _difference(a: Any, b: Any) -> str:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
        diff = (a.double() - b.double()).abs()
        return f"{int((diff > 0).sum())} of {a.numel()} elements, max |diff| {float(diff.max()):.3g}"
    return f"{a!r} vs {b!r}"


def check_error_on_every_rank(results: Sequence[Mapping[str, Any]], *, type_name: str,
                              patterns: Sequence[str] = ()) -> None:
    """Every rank raised the same error, one of whose classes is named ``type_name`` (a regex),
    with a message matching every regex in ``patterns``."""
    errors = [r.get("error") for r in results]
    missing = [rank for rank, e in enumerate(errors) if e is None]
    if missing:
        raise WrongError(f"rank(s) {missing} raised no error; expected {type_name}")
    for rank, (mro, message) in enumerate(errors):
        if not any(re.fullmatch(type_name, cls) for cls in mro):
            raise WrongError(f"rank {rank} raised {mro[0]}, not a {type_name}: {message}")
        for pattern in patterns:
            if not re.search(pattern, message, re.IGNORECASE):
                raise WrongError(f"rank {rank}'s {mro[0]} does not name {pattern!r}: {message}")
    if len({tuple(e[1:]) for e in errors}) != 1:
        raise WrongError(f"ranks raised different errors: {[e[1] for e in errors]}")
