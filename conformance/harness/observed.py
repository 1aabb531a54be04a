"""What the probes recorded, summarised as the contract's :class:`~conformance.contract.results.ObservedCollectives`:
the collectives of one phase (or one op call), the matmuls each overlapped, the fused ops, what other threads ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conformance.contract.results import ObservedCollective, ObservedCollectives, ObservedMatmul

if TYPE_CHECKING:
    from conformance.harness.probes.collective_log import CollectiveLog


def observed_collectives(log: CollectiveLog, start: int = 0, end: int | None = None) -> ObservedCollectives:
    """The collectives ``log`` launched between two event indices."""
    end = len(log.events) if end is None else end
    found = []
    for index, call in enumerate(log.calls):
        if not start <= call.launched < end:
            continue
        found.append(ObservedCollective(
            kind=call.kind, op=call.op, api=call.api, overlappable=call.overlappable,
            group_ranks=call.group_ranks, shapes=tuple(call.shapes),
            overlapped=tuple(ObservedMatmul(e.shape, e.operands) for e in log.matmuls_while_in_flight(index, end)),
            pending=call.overlappable and call.waited is None and not call.functional, group_state=call.group_state,
        ))
    fused = tuple(e.op for e in log.events[start:end] if e.what == "matmul" and e.label == "fused")
    unseen = [e for e in log.events[start:end] if e.what == "other_thread"]
    return ObservedCollectives(tuple(found), fused, tuple(e.label for e in unseen if e.op != "matmul"),
                               tuple(e.label for e in unseen if e.op == "matmul"))
