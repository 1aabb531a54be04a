"""How HCCL's reductions combine the ranks' contributions: in the order the ranks arrived.

Every rank's contribution travels bit for bit (as bytes, with data movement only) together with the
moment the rank arrived at the collective, read from a clock every process of the node shares
(``time.monotonic_ns``).  Each rank then folds the contributions left to right in arrival order (ties by
rank), rounding in the tensor's dtype at every step as the device's reduction does, so all ranks hold
the same bits, and those bits depend on who came first.  With ``HCCL_DETERMINISTIC`` set to ``true`` or
``strict`` (HCCL environment variable reference) the fold is in rank order: the same bits on every run.
Run-to-run determinism is then something an implementation earns, as on hardware.

Operators follow torch_npu's HCCL mapping: SUM, PRODUCT, MIN, MAX; AVG is a SUM divided by the group size
afterwards; a bool SUM is a MAX (a logical or).  BAND, BOR, BXOR and PREMUL_SUM are refused.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

_STAMP = 8  # bytes of the arrival time in front of each contribution

#: Data types HCCL reduces (torch_npu's supported HCCL data types; bool and uint8 go as int32).
REDUCIBLE = (torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16,
             torch.bool, torch.uint8)
_OPS = {
    dist.ReduceOp.RedOpType.SUM: torch.Tensor.add_,
    dist.ReduceOp.RedOpType.AVG: torch.Tensor.add_,
    dist.ReduceOp.RedOpType.PRODUCT: torch.Tensor.mul_,
    dist.ReduceOp.RedOpType.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    dist.ReduceOp.RedOpType.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
}


def arrival() -> int:
    """Now, on the clock every process of the node shares."""
    return time.monotonic_ns()


def check(collective: str, op: dist.ReduceOp.RedOpType, dtype: torch.dtype) -> None:
    """Refuse, as torch_npu's HCCL does, an operator or data type HCCL does not reduce."""
    if op not in _OPS:
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with HCCL")
    if dtype not in REDUCIBLE:
        raise RuntimeError(f"HCCL {collective}: Unsupported data type {dtype}")


def pack(contributions: list[torch.Tensor], arrived_ns: int) -> torch.Tensor:
    """The contributions' bytes behind the arrival time: what travels to the other ranks."""
    stamp = torch.tensor([arrived_ns], dtype=torch.int64).view(torch.uint8)
    return torch.cat([stamp, *(c.detach().contiguous().reshape(-1).view(torch.uint8) for c in contributions)])


def unpack(packed: torch.Tensor, likes: list[torch.Tensor]) -> tuple[int, list[torch.Tensor]]:
    """The arrival time and the contributions (each shaped like its ``likes`` entry) of one packed buffer."""
    arrived = int(packed[:_STAMP].view(torch.int64)[0])
    contributions, start = [], _STAMP
    for like in likes:
        size = like.numel() * like.element_size()
        chunk = packed[start:start + size]
        if start % like.element_size():
            chunk = chunk.clone()  # a view as a wider dtype needs an aligned offset
        contributions.append(chunk.view(like.dtype).view(like.shape))
        start += size
    return arrived, contributions


def order(arrivals: list[int], deterministic: bool) -> list[int]:
    """The ranks in the order their contributions are folded."""
    ranks = list(range(len(arrivals)))
    return ranks if deterministic else sorted(ranks, key=lambda r: (arrivals[r], r))


def fold(contributions: list[torch.Tensor], arrivals: list[int], op: dist.ReduceOp.RedOpType,
         deterministic: bool) -> torch.Tensor:
    """The reduction of the ranks' contributions, left to right in :func:`order`."""
    ranks = order(arrivals, deterministic)
    dtype = contributions[0].dtype
    widened = dtype in (torch.bool, torch.uint8)
    first = contributions[ranks[0]]
    total = first.to(torch.int32) if widened else first.clone()
    combine = _OPS[op]
    if dtype == torch.bool and op in (dist.ReduceOp.RedOpType.SUM, dist.ReduceOp.RedOpType.AVG):
        combine = _OPS[dist.ReduceOp.RedOpType.MAX]
    for rank in ranks[1:]:
        other = contributions[rank]
        combine(total, other.to(torch.int32) if widened else other)
    if op == dist.ReduceOp.RedOpType.AVG:
        total = total.div_(len(contributions)) if total.is_floating_point() else total.div_(
            len(contributions), rounding_mode="trunc")
    return total.to(dtype) if widened else total
