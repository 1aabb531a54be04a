"""Implementations that test the harness's verdicts on time, not the checks.

Correct in what they compute; what differs is how long loading them takes
(``docs/DESIGN.md#time-budget``: the budget starts once the implementation is
loaded on the ranks, and the load is bounded by the ceiling only), or that
one rank stalls while the others go on (``#progress-evidence``).
"""

from __future__ import annotations

import time

from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls import DeadlocksEverywhere

#: Seconds :class:`SlowToLoad` takes to load: several budget floors of the tests that use it.
LOAD_S = 2.0


class SlowToLoad(ReferenceCoC):
    """Takes :data:`LOAD_S` to construct, as a large training framework takes to import."""

    name = "slow-to-load"

    def __init__(self) -> None:
        time.sleep(LOAD_S)
        super().__init__()


class HangsWhileLoading(ReferenceCoC):
    """Never finishes loading (an import that waits for something that never comes)."""

    name = "hangs-while-loading"

    def __init__(self) -> None:
        while True:
            time.sleep(0.05)


class StallsOnRankZero(DeadlocksEverywhere):
    """A deadlock storm: rank 0 of every op and every patched layer stalls (asleep) before any collective.

    The ops and the patch are :class:`DeadlocksEverywhere`'s; only the stall differs.

    The other ranks poll an all-reduce rank 0 never joins, every millisecond
    (tens of ms of CPU a second): their CPU time and their polls are theirs, no
    evidence that rank 0 progressed (``docs/DESIGN.md#progress-evidence``).
    Each stall ends after :data:`STALL_S` (the ranks are killed long before).
    """

    name = "stalls-on-rank-zero"

    def _stall(self) -> None:
        import torch
        import torch.distributed as dist

        end = time.monotonic() + STALL_S
        if dist.get_rank() == 0:
            while time.monotonic() < end:
                time.sleep(0.05)
            return
        work = dist.all_reduce(torch.ones(1), async_op=True)
        while time.monotonic() < end and not work.is_completed():
            time.sleep(0.001)


#: How long :class:`StallsOnRankZero` sleeps: past the ceiling (120 s).
STALL_S = 600.0
