"""Implementations that test the harness's verdicts on time, not the checks.

Correct in what they compute; what differs is how long loading them takes
(``docs/DESIGN.md#time-budget``: the budget starts once the implementation is
loaded on the ranks, and the load is bounded by the ceiling only).
"""

from __future__ import annotations

import time

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
