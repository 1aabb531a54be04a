"""The one timing harness: interleaved rounds, barriers, device sync, the slowest rank.

Used by the perf gates and the benchmark (``conformance.judge.perf``) and by
``--coc-parallel-num auto`` (``coc_impl.autotune``), so a figure means the same
wherever it was measured: every item is warmed up, then timed in rounds that
interleave all items (A B C A B C ...), the order rotated each round so no item
always follows the same neighbour; each timed call starts after a barrier and
ends after the device finished; a sample is the maximum over ranks.  What an
item allocates is its own business: the callers time calls that allocate
fresh outputs, as real layers do (``docs/DESIGN.md#perf-gates``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Settings:
    """How many warm-up calls and timed rounds each item gets."""

    warmup: int = 2
    repeats: int = 8

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1:
            raise ValueError(f"need warmup >= 0 and repeats >= 1, got {self.warmup}, {self.repeats}")


def warm_up(items: Mapping[str, Callable[[], Any]], rounds: int, *, barrier: Callable[[], None],
            synchronize: Callable[[], None]) -> None:
    """Call every item ``rounds`` times, untimed (caches, allocator, lazy setup such as ``auto``)."""
    for _ in range(rounds):
        for call in items.values():
            barrier()
            call()
            synchronize()


def time_interleaved(
    items: Mapping[str, Callable[[], Any]],
    settings: Settings,
    *,
    barrier: Callable[[], None],
    synchronize: Callable[[], None],
    max_over_ranks: Callable[[list[float]], list[float]],
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Milliseconds per item and round, each the maximum over ranks.

    Every rank must call this with the same items in the same order (each
    timed call is a collective step).  ``max_over_ranks`` is called once, at
    the end, with all samples flattened.
    """
    names = list(items)
    warm_up(items, settings.warmup, barrier=barrier, synchronize=synchronize)
    flat: list[float] = []
    order: list[str] = []
    for round_index in range(settings.repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            barrier()
            start = clock()
            items[name]()
            synchronize()
            flat.append((clock() - start) * 1e3)
            order.append(name)
    slowest = max_over_ranks(flat)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name, value in zip(order, slowest, strict=True):
        samples[name].append(float(value))
    return samples




def no_sync() -> None:
    """CPU work is finished when the call returns."""


def medians(samples: Mapping[str, list[float]]) -> dict[str, float]:
    """The median of each item's samples."""
    import statistics

    return {name: statistics.median(values) for name, values in samples.items()}
