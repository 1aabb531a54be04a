"""Straggler injection: a rank delayed before its collectives, reproducibly (the suite's slow-rank cases)."""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Straggler:
    """Delays this rank before collectives: every one (``every``) or each with ``probability``.

    ``seconds`` is the longest delay; each is drawn uniformly from ``[0, seconds]``
    with a generator seeded per rank, so a run is reproducible.
    """

    seconds: float
    seed: int = 0
    probability: float = 1.0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def __call__(self) -> None:
        if self._rng.random() < self.probability:
            time.sleep(self._rng.random() * self.seconds)

    @classmethod
    def of_rank(cls, rank: int, seconds: float, slow_rank: int | None, key: str,
                probability: Callable[[int], float]) -> Straggler | None:
        """The straggler of ``rank`` in a case that delays ``slow_rank`` alone (before each collective) or, naming
        none, every rank (each collective with ``probability(seed)``); none where ``seconds`` is not positive.
        Seeded by the rank and the case's ``key``, so a run is reproducible."""
        if seconds <= 0:
            return None
        seed = zlib.crc32(f"{rank}/{key}".encode())
        if slow_rank is not None:
            return cls(seconds, seed) if rank == slow_rank else None
        return cls(seconds, seed, probability=probability(seed))
