"""Two-lane pipeline model of a chunked matmul + collective.

One lane multiplies chunks, the other communicates them, each lane one chunk at
a time and in block order.  ``compute_first`` models a matmul whose output is
communicated (row-parallel all-reduce / reduce-scatter): the matmul lane runs
back to back and ``comm_i`` starts at ``max(end(mm_i), end(comm_{i-1}))``.
``comm_first`` models a collective whose output is multiplied (all-gather then
matmul), mirrored: the comm lane runs back to back and ``mm_i`` starts at
``max(end(comm_i), end(mm_{i-1}))``.

Feed it the fitted costs *without* the planner's inflation factor: the model
predicts what the plan achieves, the inflation only makes the plan robust.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from coc_shared.cost_curves import CostCurve

Order = Literal["compute_first", "comm_first"]
ORDERS: tuple[Order, ...] = ("compute_first", "comm_first")
Interval = tuple[float, float]


@dataclass(frozen=True)
class Timeline:
    """Per-block ``(start, end)`` of both lanes, in microseconds, and summaries.

    * ``makespan``: end of the last task of either lane.
    * ``exposed_comm``: total time the comm lane is busy while the matmul lane
      is idle (before the first matmul, in the gaps between matmuls, after the
      last one) - the communication the overlap failed to hide.  Neither order
      ever leaves both lanes idle, so ``makespan == total_mm + exposed_comm``.
    * ``serial``: the unchunked baseline ``CostMM(M) + CostComm(M)``, ``M`` the
      sum of the blocks.
    * ``ideal``: ``max(total_mm, total_comm)`` over the chunks, the makespan
      of perfect overlap; no order can beat it.
    """

    blocks: tuple[int, ...]
    order: Order
    mm: tuple[Interval, ...]
    comm: tuple[Interval, ...]
    serial: float

    @property
    def total_mm(self) -> float:
        return sum(end - start for start, end in self.mm)

    @property
    def total_comm(self) -> float:
        return sum(end - start for start, end in self.comm)

    @property
    def makespan(self) -> float:
        return max(self.mm[-1][1], self.comm[-1][1])

    @property
    def ideal(self) -> float:
        return max(self.total_mm, self.total_comm)

    @property
    def serial_chunks(self) -> float:
        """Chunked but not overlapped: every block's matmul plus its collective."""
        return self.total_mm + self.total_comm

    @property
    def exposed_comm(self) -> float:
        return self.total_comm - _overlap(self.comm, self.mm)

    @property
    def gain(self) -> float:
        """Predicted fractional saving over the unchunked serial run."""
        return (self.serial - self.makespan) / self.serial if self.serial > 0 else 0.0


def simulate(
    blocks: Sequence[int],
    mm_cost: CostCurve,
    comm_cost: CostCurve,
    order: Order = "compute_first",
) -> Timeline:
    """Schedule ``blocks`` on the two lanes with row costs ``mm_cost``, ``comm_cost``."""
    blocks = tuple(blocks)
    if not blocks or any(b < 1 for b in blocks):
        raise ValueError(f"blocks must be non-empty positive row counts, got {blocks}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    mm_t = [_duration(mm_cost, b, "matmul") for b in blocks]
    comm_t = [_duration(comm_cost, b, "comm") for b in blocks]
    first, second = (mm_t, comm_t) if order == "compute_first" else (comm_t, mm_t)
    lead, follow = _two_lanes(first, second)
    mm, comm = (lead, follow) if order == "compute_first" else (follow, lead)
    M = sum(blocks)
    return Timeline(blocks, order, mm, comm, serial=mm_cost(M) + comm_cost(M))


def _two_lanes(
    first: Sequence[float], second: Sequence[float]
) -> tuple[tuple[Interval, ...], tuple[Interval, ...]]:
    """Leading lane back to back; task i of the other lane waits for both lanes."""
    lead: list[Interval] = []
    follow: list[Interval] = []
    lead_end = follow_end = 0.0
    for d_first, d_second in zip(first, second, strict=True):
        lead.append((lead_end, lead_end + d_first))
        lead_end += d_first
        start = max(lead_end, follow_end)
        follow.append((start, start + d_second))
        follow_end = start + d_second
    return tuple(lead), tuple(follow)


def _duration(cost: CostCurve, rows: int, lane: str) -> float:
    t = cost(rows)
    if not t >= 0:
        raise ValueError(f"{lane} cost of {rows} rows is {t} us; the fit is invalid at this size")
    return t


def _overlap(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the intersection of two sorted lists of disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
