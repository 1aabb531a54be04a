"""ColossalAI 0.5.0: the ring all-gather keeps the wrong gathered input, so ring-mode weight gradients are wrong.

``_ring_as_gather`` (``colossalai/shardformer/layer/_operation.py``) appends
the *same* ``send_tensors`` dict to ``input_tensors`` at every step (its
entries are swapped in place afterwards) and, at the last step, appends it
while computing with ``recv_tensors``.  The output is right; the gathered
input it returns -- which ``_LinearWithGatherForwardReduceScatterBackward``
keeps as ``ctx.gathered_input`` for the weight gradient -- holds the wrong
ranks' shards.  This script prints, per rank, which rank's shard each block
of rows of the gathered input holds, and the weight gradient's error against
float64.  CPU, gloo::

    COLOSSALAI_SRC=/path/to/colossalai-0.5.0 python docs/defects/colossalai_ring_gathered_input.py [TP ...]
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from conformance.adapters.colossalai import load_operation  # noqa: E402  (ColossalAI's own module, no copy)

M, K, N = 4, 8, 6  # tokens per rank, hidden in, hidden out


def rank_main(rank: int, tp: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    ops = load_operation()
    gen = torch.Generator().manual_seed(0)
    x_all = torch.randn(M * tp, K, generator=gen, dtype=torch.float64)  # every rank's tokens, rank-major
    w = torch.randn(N, K, generator=gen, dtype=torch.float64)
    grad_all = torch.randn(M * tp, N, generator=gen, dtype=torch.float64)
    x = x_all[rank * M:(rank + 1) * M].unsqueeze(0).float().requires_grad_()  # [batch 1, seq, hidden]
    weight = w.float().requires_grad_()
    out = ops.linear_gather_forward_reducescatter_backward(x, weight, None, dist.group.WORLD, True, 1, ring=True)
    out.backward(grad_all.float().unsqueeze(0))
    held = ops._ring_as_gather(torch.nn.functional.linear, {"input": x.detach()}, {"weight": weight.detach()},
                               dist.group.WORLD, 1)[1]["input"][0].double()
    shards = [next((r for r in range(tp) if torch.allclose(held[b * M:(b + 1) * M], x_all[r * M:(r + 1) * M])), -1)
              for b in range(tp)]
    expected = grad_all.T @ x_all  # this rank's dW: every token's gradient against every token's input
    error = (weight.grad.double() - expected).abs().max().item()
    out_error = (out[0].double() - x_all @ w.T).abs().max().item()
    print(f"TP {tp} rank {rank}: rows of the gathered input hold the shards of ranks {shards} "
          f"(want {list(range(tp))}); output max error {out_error:.1e}; weight-grad max error {error:.3g} "
          f"(|dW| max {expected.abs().max().item():.3g})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    for i, size in enumerate(int(a) for a in (sys.argv[1:] or ["2", "4"])):
        mp.spawn(rank_main, args=(size, 29400 + os.getpid() % 500 + i), nprocs=size)
