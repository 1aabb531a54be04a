"""Every rank's piece put back together: the inverse of :func:`conformance.contract.layouts.shard`.

Replicated pieces must be bitwise identical; the judge checks that while it
rebuilds the global tensor, so a copy that drifted is named with its rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.layouts import Split
from conformance.judge.failures import ReplicaMismatch


def assemble(pieces: Sequence[torch.Tensor], split: Split, name: str = "tensor") -> torch.Tensor:
    """The global tensor from every rank's piece (inverse of :func:`shard`).

    Replicated pieces must be bitwise identical (the same NaN counts as equal:
    rows nobody wrote are then reported by the numeric check, with their place).
    """
    if split is Split.FULL:
        for rank, piece in enumerate(pieces[1:], start=1):
            if not bitwise_equal(piece, pieces[0]):
                raise ReplicaMismatch(f"{name}: rank {rank}'s copy differs from rank 0's, which every rank must "
                                      f"hold identically ({describe_difference(pieces[0], piece)})")
        return pieces[0]
    if split is Split.PARTIAL:
        return torch.stack([p.double() for p in pieces]).sum(0)
    dim = 0 if split in (Split.SEQ, Split.ROWS) else -1
    return torch.cat(list(pieces), dim=dim)
