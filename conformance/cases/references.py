"""The suite's own reference on the ranks, defined independently of any implementation.

:func:`serial_composition`: the plain path in the op's dtype (matmul, then the
collective, or the reverse for a gather), the ``serial`` term of the error
bound.  A deterministic result has no reference of its own: any fixed
summation order is deterministic (``conformance/judge/determinism.py``).
"""

from __future__ import annotations

from typing import Any

from conformance.cases.groups import TPPlace
from conformance.contract.layouts import GATHERS


def serial_composition(place: TPPlace, op: str, x: Any, w: Any, bias: Any) -> Any:
    """The plain path in the op's dtype: matmul, then the collective (or the reverse)."""
    import torch
    import torch.distributed as dist

    tp, group = place.tp, place.group
    if op in GATHERS:
        gathered = torch.empty((x.shape[0] * tp, x.shape[1]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
        y = gathered @ w
        y = y if bias is None else y + bias
        return (y, gathered) if op == "all_gather_matmul_v2" else y
    y = x @ w
    if op == "matmul_all_reduce":
        dist.all_reduce(y, group=group)
    else:
        if y.shape[0] % tp:
            return None  # no serial layout exists: the implementation must refuse
        shard_out = torch.empty((y.shape[0] // tp, y.shape[1]), dtype=y.dtype, device=y.device)
        dist.reduce_scatter_tensor(shard_out, y.contiguous(), group=group)
        y = shard_out
    return y if bias is None else y + bias
