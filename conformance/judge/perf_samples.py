"""The statistics of timed samples the perf protocol (:mod:`conformance.judge.perf`) reports: medians and spreads,
the paired gains of rounds run back to back, and a bootstrap interval for their median."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from conformance.record.intervals import CI_LEVEL, percentile_interval


def pooled(*runs: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """The samples of several measurements of the same items, as one (rounds appended)."""
    keys = set.intersection(*(set(run) for run in runs))
    return {key: [v for run in runs for v in run[key]] for key in runs[0] if key in keys}


@dataclass(frozen=True)
class Stats:
    """Median and inter-quartile range of repeated samples."""

    median: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        values = np.asarray(samples, dtype=np.float64)
        if values.size == 0:
            raise ValueError("no samples")
        q1, median, q3 = np.percentile(values, [25, 50, 75])
        return cls(float(median), float(q1), float(q3), int(values.size))

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median (0.05 = 5 %)."""
        return (self.q3 - self.q1) / abs(self.median) if self.median else float("inf")


def paired_gains(serial: Sequence[float], coc: Sequence[float]) -> list[float]:
    """``(serial_i - coc_i) / serial_i`` per round."""
    if len(serial) != len(coc):
        raise ValueError(f"unpaired samples: {len(serial)} serial, {len(coc)} CoC")
    return [(s - c) / s for s, c in zip(serial, coc, strict=True)]


def median_ci(values: Sequence[float], *, level: float = CI_LEVEL, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval for the median of ``values`` (fixed seed: reproducible)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no samples")
    picks = np.random.default_rng(seed).integers(0, data.size, size=(resamples, data.size))
    return percentile_interval(np.median(data[picks], axis=1), level=level)
