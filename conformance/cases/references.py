"""The suite's own references on the ranks, defined independently of any implementation.

* :func:`serial_composition`: the plain path in the op's dtype (matmul, then
  the collective, or the reverse for a gather);
* :func:`deterministic_reference`: the serial deterministic result::

    P_r = x_r.float() @ w_r.float()            (the rank's fp32 partial)
    S   = (((P_0 + P_1) + P_2) + ...)          (ascending rank order, fp32)
    out = (S + bias.float()).to(dtype)         (bias once, one final cast)

  with ``w_r`` the logical ``[k, n]`` weight, contiguous; for reduce-scatter
  rank ``r`` keeps rows ``r*m/tp : (r+1)*m/tp`` of ``out``.
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


def deterministic_reference(place: TPPlace, op: str, x: Any, w: Any, bias: Any) -> Any:
    """The serial deterministic result (module docstring) for this rank."""
    import torch
    import torch.distributed as dist

    tp = place.tp
    partial = x.float() @ w.float().contiguous()
    gathered = torch.empty((tp * partial.shape[0], partial.shape[1]), dtype=torch.float32, device=partial.device)
    dist.all_gather_into_tensor(gathered, partial.contiguous(), group=place.group)
    parts = gathered.view(tp, *partial.shape)
    total = parts[0].clone()
    for r in range(1, tp):
        total = total + parts[r]
    if op == "matmul_reduce_scatter":
        total = total.chunk(tp, dim=0)[place.tp_rank]
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype)
