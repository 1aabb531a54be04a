"""A CoC variant's perf from one run to another: the change of its median paired gain, and its interval.

Perf regressions compare the per-round *paired* gains of each CoC variant
(``(serial - coc) / serial``, measured back to back) of the two runs: a
bootstrap interval of the difference of their medians.  A drop larger than
the threshold is *clear* when the whole interval lies below minus the
threshold, else it is *within the noise* of the two runs -- reported, not
gating.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.record.intervals import CI_LEVEL, percentile_interval

#: Drop of the median paired gain (fraction of the serial time) that counts as a perf regression.
PERF_THRESHOLD = 0.03


@dataclass(frozen=True)
class PerfChange:
    case: str
    variant: str
    baseline: float
    current: float
    change: float
    interval: tuple[float, float]
    threshold: float = PERF_THRESHOLD

    @property
    def regression(self) -> bool:
        return self.change < -self.threshold

    @property
    def clear(self) -> bool:
        return self.interval[1] < -self.threshold

    @property
    def verdict(self) -> str:
        return "clear" if self.clear else "within the noise of the two runs"


def perf_changes(cid: str, before: Mapping[str, Any], now: Mapping[str, Any], threshold: float,
                 seed: int) -> list[PerfChange]:
    """The change of each CoC variant's median paired gain from ``before`` to ``now`` (a case's ``perf``
    records), with its interval."""
    changes = []
    for variant, figures in now.get("variants", {}).items():
        old = before.get("variants", {}).get(variant)
        a, b = (old or {}).get("paired_gains"), figures.get("paired_gains")
        if not a or not b:
            continue
        low, high = difference_ci(a, b, seed=seed)
        changes.append(PerfChange(cid, variant, float(np.median(a)), float(np.median(b)),
                                  float(np.median(b) - np.median(a)), (low, high), threshold))
    return changes


def difference_ci(before: Sequence[float], after: Sequence[float], *, level: float = CI_LEVEL,
                  resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``median(after) - median(before)`` (independent samples)."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    mx = np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)
    my = np.median(y[rng.integers(0, y.size, size=(resamples, y.size))], axis=1)
    return percentile_interval(my - mx, level=level)
