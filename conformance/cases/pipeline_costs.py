"""The operands of a perf case's pipeline and its costs alone: the matmul alone, the collective alone.

What :func:`conformance.cases.perf_cases.pipeline_perf_case` times beside
serial and CoC: the megatron layer, its input and the cost items' buffers, all
on the rank's device (drawn on the CPU from the rank's seed, then moved), and
on a CPU the CPU time the matmul and the collective burn (the collective's
copies and reductions compete with the matmul for the same cores).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from conformance.contract.perf_items import COMM, MM


def pipeline_operands(op: str, m: int, k: int, n: int, dtype: str, *, group: Any, rank: int,
                      device: str) -> tuple[Any, Any, CostItems]:
    """This rank's megatron layer of the pipeline, its input ``x`` and the cost items' buffers, all on
    ``device`` (drawn on the CPU from the rank's seed, then moved).  Inside ``model_parallel``."""
    import torch

    from coc_shared.megatron import build_column, build_row

    tp, torch_dtype = group.size(), getattr(torch, dtype)
    gen = torch.Generator().manual_seed(1234 + rank)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=torch_dtype)

    if op == "all_gather_matmul":
        layer = build_column(k, n * tp, bias=False, sequence_parallel=True, dtype=torch_dtype, device=device)
        x = rand(m // tp, k)
    else:
        layer = build_row(k * tp, n, bias=False, sequence_parallel=op != "matmul_all_reduce", dtype=torch_dtype,
                          device=device)
        x = rand(m, k)
    return layer, x, CostItems(op, x, layer.weight.t(), group, rand)


def cpu_demand(items: dict[str, Callable[[], Any]], group: Any, *, calls: int) -> dict[str, float]:
    """CPU ms one call of the matmul and of the collective burn, summed over the group's processes.

    Process CPU time covers every thread (the backend's too); ranks that are
    threads of one process share it, so each reports its share.
    """
    import os

    import torch
    import torch.distributed as dist

    pids: list[int | None] = [None] * group.size()
    dist.all_gather_object(pids, os.getpid(), group=group)
    ranks_here = pids.count(os.getpid())
    per_call = []
    for key in (MM, COMM):
        dist.barrier(group=group)
        start = time.process_time()
        for _ in range(calls):
            items[key]()
        per_call.append((time.process_time() - start) * 1e3 / calls / ranks_here)
    total = torch.tensor(per_call, dtype=torch.float64)
    dist.all_reduce(total, group=group)
    return {"mm_ms": float(total[0]), "comm_ms": float(total[1]), "ranks": group.size(),
            "cores": len(os.sched_getaffinity(0))}


class CostItems:
    """The matmul alone and the collective alone, on the leading rows of full-size buffers."""

    def __init__(self, op: str, x: Any, w_kn: Any, group: Any, rand: Callable[..., Any]) -> None:
        import torch

        self.op, self.group, self.tp, self.w_kn = op, group, group.size(), w_kn
        k, n = w_kn.shape
        rows = x.shape[0] * (self.tp if op == "all_gather_matmul" else 1)
        self.lhs = rand(rows, k)  # for the all-gather: the gathered x
        width = k if op == "all_gather_matmul" else n
        self.sent = rand(rows, width)
        self.received = torch.empty(rows, width, dtype=x.dtype, device=x.device)
        self.x = x

    def matmul(self, rows: int) -> None:
        import torch

        torch.matmul(self.lhs[:rows], self.w_kn)  # a fresh output, like the pipelines'

    def collective(self, rows: int) -> None:
        import torch.distributed as dist

        shard = rows // self.tp
        if self.op == "matmul_all_reduce":
            dist.all_reduce(self.sent[:rows], group=self.group)
        elif self.op == "matmul_reduce_scatter":
            dist.reduce_scatter_tensor(self.received[:shard], self.sent[:rows], group=self.group)
        else:
            dist.all_gather_into_tensor(self.received[:rows], self.sent[:shard], group=self.group)

    @functools.cached_property
    def kept_product(self) -> Any:
        """The serial product's buffer of :meth:`serial_reused` (allocated only if that row is asked for)."""
        import torch

        n = self.w_kn.shape[1]
        return torch.empty(self.lhs.shape[0], n, dtype=self.x.dtype, device=self.x.device)

    def serial_reused(self) -> None:
        """The serial composition, every buffer (the output too) kept from the previous call."""
        import torch
        import torch.distributed as dist

        if self.op == "all_gather_matmul":
            dist.all_gather_into_tensor(self.lhs, self.x, group=self.group)
            torch.matmul(self.lhs, self.w_kn, out=self.kept_product)
            return
        torch.matmul(self.x, self.w_kn, out=self.kept_product)
        if self.op == "matmul_all_reduce":
            dist.all_reduce(self.kept_product, group=self.group)
        else:
            shard = self.kept_product.shape[0] // self.tp
            dist.reduce_scatter_tensor(self.received[:shard], self.kept_product, group=self.group)
