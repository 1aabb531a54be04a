"""Every rank's piece put back together: the inverse of :func:`conformance.contract.layouts.shard`.

A replicated tensor is held by every rank.  Each copy must lie within the
error bound (MUST, judged copy by copy through :func:`copies`); that the copies
are bitwise identical is a SHOULD (:func:`check_identical_copies`): ranks
that round differently -- another reduction order per rank, say -- still give
correct numbers, though a training run then drifts apart replica by replica.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.layouts import Split
from conformance.record.failures import ContractViolation, ReplicaMismatch
from conformance.record.levels import Level

if TYPE_CHECKING:
    import torch


class _RankOutcome(Protocol):
    replica: int
    tp_rank: int


Outcome = TypeVar("Outcome", bound=_RankOutcome)


def by_replica(outcomes: Sequence[Outcome]) -> dict[int, list[Outcome]]:
    """Rank outcomes grouped by data-parallel replica, each ordered by TP rank."""
    groups: dict[int, list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault(outcome.replica, []).append(outcome)
    return {r: sorted(g, key=lambda o: o.tp_rank) for r, g in sorted(groups.items())}


def assemble(pieces: Sequence[torch.Tensor], split: Split) -> torch.Tensor:
    """The global tensor from every rank's piece (inverse of :func:`shard`); rank 0's copy when replicated.

    Pieces that cannot be one tensor's shards -- of other shapes on other ranks -- fail the check that assembles
    them (:class:`~conformance.record.failures.ContractViolation`, naming every rank's shape), never the suite.
    """
    import torch

    if split is Split.FULL:
        return pieces[0]
    shapes = [tuple(p.shape) for p in pieces]
    if len(set(shapes)) > 1:
        raise ContractViolation(f"the ranks' pieces are not shards of one tensor ({split.value} split): "
                                + ", ".join(f"rank {rank} {list(shape)}" for rank, shape in enumerate(shapes))
                                + "; every rank's piece has the shape of one shard")
    if split is Split.PARTIAL:
        return torch.stack([p.double() for p in pieces]).sum(0)
    dim = 0 if split in (Split.SEQ, Split.ROWS) else -1
    return torch.cat(list(pieces), dim=dim)


def copies(pieces: Sequence[torch.Tensor], split: Split) -> list[tuple[str, torch.Tensor]]:
    """Every distinct global tensor the ranks hold, each with who holds it ("" when there is one).

    A replicated tensor whose copies differ gives one entry per distinct
    copy, so each is judged against the bound on its own.
    """
    if split is not Split.FULL:
        return [("", assemble(pieces, split))]
    distinct: list[tuple[list[int], torch.Tensor]] = []
    for rank, piece in enumerate(pieces):
        same = next((holders for holders, seen in distinct if bitwise_equal(seen, piece)), None)
        if same is None:
            distinct.append(([rank], piece))
        else:
            same.append(rank)
    if len(distinct) == 1:
        return [("", distinct[0][1])]
    return [(f"the copy on rank(s) {holders}", piece) for holders, piece in distinct]


#: A copy of a replicated tensor -> its worst ``|error| / bound`` (at most 1: within the error bound).
WorstRatio = Callable[["torch.Tensor"], float]


def check_identical_copies(pieces: Sequence[torch.Tensor], split: Split, name: str = "tensor",
                           worst_ratio: WorstRatio | None = None) -> int:
    """SHOULD: the ranks' copies of a replicated tensor are bitwise identical (the same NaN counts as equal).

    With ``worst_ratio`` the message says of both copies whether each lies
    within the error bound (computed only on a mismatch).  Returns how many
    copies it compared with rank 0's (0 when the tensor is not replicated, or
    held by one rank: nothing to compare).
    """
    if split is not Split.FULL:
        return 0
    for rank, piece in enumerate(pieces[1:], start=1):
        if not bitwise_equal(piece, pieces[0]):
            verdicts = _bound_verdicts(pieces, rank, worst_ratio)
            raise ReplicaMismatch(f"{name}: rank {rank}'s copy differs bitwise from rank 0's "
                                  f"({describe_difference(pieces[0], piece)}); {verdicts}; replicas that differ "
                                  "drift apart over training", level=Level.SHOULD)
    return len(pieces) - 1


def _bound_verdicts(pieces: Sequence[torch.Tensor], rank: int, worst_ratio: WorstRatio | None) -> str:
    """``"rank 0's copy is within the error bound (worst/bound 0.2), rank 1's is outside it (3.1)"``."""
    if worst_ratio is None:
        return "each copy is judged against the error bound on its own (numerics)"
    verdicts = []
    for holder in (0, rank):
        try:
            ratio = worst_ratio(pieces[holder])
        except Exception as error:  # noqa: BLE001 - a copy that cannot be compared (shape, dtype) says so
            verdicts.append(f"rank {holder}'s copy cannot be judged against the bound ({type(error).__name__})")
            continue
        verdicts.append(f"rank {holder}'s copy is {'within' if ratio <= 1 else 'OUTSIDE'} the error bound "
                        f"(worst |error|/bound {ratio:.3g})")
    return ", ".join(verdicts)
