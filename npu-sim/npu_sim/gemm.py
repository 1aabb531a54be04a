"""The device's GEMM: float32 accumulation over a shape-dependent split of ``k``, rounded once.

A device GEMM library picks its tiling from the problem's shape: when the output has too few tiles to
keep every core busy, it splits ``k`` across cores and adds the partial products afterwards.  So the bits
of one output row depend on how many rows (and columns) the GEMM was given, not only on that row's data.
The NPU's own tiling is not published; the emulator's rule, modelled on that practice, is:

* tiles = ``ceil(m / 128) * ceil(n / 128) * batch``;
* splits = 1 when tiles >= 20 (the cube cores of an Atlas A2 die, order of magnitude), else
  ``min(20 // tiles, k // 256)`` rounded down to a power of two (at least 1);
* each split's product is computed in float32, the partial products are added in split order in
  float32, ``beta * input`` is added last (addmm / baddbmm), and the sum is rounded once to the output
  dtype.

It applies to float16, bfloat16 and float32 ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` (and their ``out=``
variants): everything ``matmul`` and ``linear`` decompose to.  Other dtypes run as the CPU's kernels.
"""

from __future__ import annotations

import math

import torch

CUBE_CORES = 20
TILE_M = 128
TILE_N = 128
K_BLOCK = 256
FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def k_splits(m: int, n: int, k: int, batch: int = 1) -> int:
    """How many parts the device splits ``k`` into for an ``[m, k] @ [k, n]`` GEMM (``batch`` of them)."""
    tiles = math.ceil(m / TILE_M) * math.ceil(n / TILE_N) * max(batch, 1)
    if tiles >= CUBE_CORES:
        return 1
    splits = min(CUBE_CORES // max(tiles, 1), k // K_BLOCK)
    return 1 << (splits.bit_length() - 1) if splits > 1 else 1


def accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in float32 over the device's split of ``k`` (``a``: ``[..., m, k]``, ``b``: ``[..., k, n]``)."""
    a32, b32 = a.float(), b.float()
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    splits = k_splits(m, n, k, a.shape[0] if a.dim() == 3 else 1)
    if splits == 1:
        return torch.matmul(a32, b32)
    step = math.ceil(k / splits)
    total = torch.matmul(a32[..., :step], b32[..., :step, :])
    for start in range(step, k, step):
        total += torch.matmul(a32[..., start:start + step], b32[..., start:start + step, :])
    return total


def _product(a, b, dtype, bias=None, beta=1, alpha=1):
    total = accumulate(a, b)
    if alpha != 1:
        total.mul_(alpha)
    if bias is not None and beta != 0:
        total.add_(bias.float(), alpha=beta)
    return total.to(dtype)


def _applies(*tensors) -> bool:
    dtype = tensors[0].dtype
    return dtype in FLOATS and all(t.dtype == dtype for t in tensors)


def _mm(raw_args, kwargs):
    a, b = raw_args[0], raw_args[1]
    return _product(a, b, a.dtype) if _applies(a, b) else None


def _addmm(raw_args, kwargs):
    bias, a, b = raw_args[0], raw_args[1], raw_args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    return _product(a, b, a.dtype, bias, beta, alpha) if _applies(bias, a, b) else None


def _handler(compute, plain_out: bool):
    """An op handler: the device GEMM where it applies, the CPU kernel otherwise; ``out=`` written in place."""
    from npu_sim.tensor import sync_metadata, unwrap_checked, wrap

    def handler(func, args, kwargs):
        raw_args = [unwrap_checked(a) for a in args]
        raw_kwargs = {key: unwrap_checked(value) for key, value in kwargs.items()}
        out = kwargs.get("out") if plain_out else None
        result = compute(raw_args, {k: v for k, v in raw_kwargs.items() if k != "out"})
        if result is None:
            result = func(*raw_args, **raw_kwargs)
            if out is None:
                return wrap(result)
            sync_metadata(out)
            return out
        if out is None:
            return wrap(result)
        target = out.raw
        if target.shape != result.shape:
            target.resize_(result.shape)
        target.copy_(result)
        sync_metadata(out)
        return out

    return handler


def handlers() -> dict:
    aten = torch.ops.aten
    return {
        aten.mm.default: _handler(_mm, False),
        aten.mm.out: _handler(_mm, True),
        aten.bmm.default: _handler(_mm, False),
        aten.bmm.out: _handler(_mm, True),
        aten.addmm.default: _handler(_addmm, False),
        aten.addmm.out: _handler(_addmm, True),
        aten.baddbmm.default: _handler(_addmm, False),
        aten.baddbmm.out: _handler(_addmm, True),
    }
