"""Implementations that test the harness's verdicts on time, not the checks.

Correct in what they compute; what differs is how long loading them takes
(``docs/DESIGN.md#time-budget``: the budget starts once the implementation is
loaded on the ranks, and the load is bounded by the ceiling only), or that
one rank stalls while the others go on (``#progress-evidence``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from coc_impl.config import CoCConfig
from coc_impl.reference import ReferenceCoC

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


class StallsOnRankZero(ReferenceCoC):
    """A deadlock storm: rank 0 of every op and every patched layer stalls (asleep) before any collective.

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

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        self._stall()
        return super().matmul_all_reduce(x, w, bias, **kw)

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        self._stall()
        return super().matmul_reduce_scatter(x, w, bias, **kw)

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        self._stall()
        return super().all_gather_matmul(x, w, bias, **kw)

    def all_gather_matmul_v2(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        self._stall()
        return super().all_gather_matmul_v2(x, w, bias, **kw)

    def patch_megatron(self, config: CoCConfig) -> Any:
        @contextmanager
        def stalled() -> Iterator[None]:
            self._stall()
            with ReferenceCoC.patch_megatron(self, config):
                yield

        return stalled()


#: How long :class:`StallsOnRankZero` sleeps: past the ceiling (120 s).
STALL_S = 600.0
