"""The intervals a record states: their confidence, and how one is read off bootstrap estimates.

A perf case states the interval of its median paired gain (:func:`conformance.judge.perf_samples.median_ci`); the
gate states the interval of the change of that median between two runs
(:func:`conformance.record.perf_changes.difference_ci`).  Both are at one level, cut the same way.
"""

from __future__ import annotations

import numpy as np

#: Confidence level of every interval the record states.
CI_LEVEL = 0.90


def percentile_interval(estimates: np.ndarray, *, level: float = CI_LEVEL) -> tuple[float, float]:
    """The central ``level`` interval of bootstrap ``estimates`` (the percentile bootstrap)."""
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)
