"""Headroom of the error bound on a device's own GEMMs: chunked CoC arithmetic vs. the serial path.

The bound (``docs/DESIGN.md#error-bound``) assumes that a GEMM of half-precision
inputs accumulates in fp32 and that splitting rows into chunks adds no
rounding.  A device's BLAS picks other kernels for a chunk than for the whole
matrix (tile shapes, split-K, reduced-precision split-K reductions), so
whether a correct CoC implementation stays inside the bound on that device is
a measurement, not an assumption.  This bench makes it: for real GEMMs on the
device at hand it computes each fused op the serial way and the chunked way
and prints the worst ``|out - truth| / bound`` of the chunked result under the
suite's own :func:`conformance.judge.numerics.compare` (at most 1 passes).

TP ranks are emulated on one device: every rank's partial GEMM runs on its
own shard; partials are summed in the working dtype, in rank order for the
serial path and rotated per chunk for the CoC path (as a ring reduce would);
the float64 truth comes from the same operands.  Exit status 1 means the bound
would fail a correct implementation on this device.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from conformance.judge import layers, numerics, ops

BOUND_OPS = ("matmul_all_reduce", "all_gather_matmul", "matmul_reduce_scatter", "weight_grad")
#: ``normal``: N(0, 1); ``shifted``: N(1, 1), sums without cancellation, as after a GELU.
DATA = ("normal", "shifted")


@dataclass(frozen=True)
class Point:
    """One measured configuration and its headroom."""

    op: str
    dtype: str
    tp: int
    m: int
    chunks: int
    data: str
    reduced_precision_reduction: bool
    worst_ratio: float
    violations: int
    serial_rel_l2: float
    coc_rel_l2: float


def _operands(m: int, k: int, n: int, dtype: torch.dtype, data: str, device: str,
              seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shift = 1.0 if data == "shifted" else 0.0
    x = (torch.randn(m, k, generator=gen) + shift).to(dtype).to(device)
    w = (torch.randn(k, n, generator=gen) / k ** 0.5 + shift / k).to(dtype).to(device)
    bias = torch.randn(n, generator=gen).to(dtype).to(device)
    return x, w, bias


def _ring_sum(parts: list[torch.Tensor], start: int) -> torch.Tensor:
    """Partials summed one by one in the working dtype, beginning at ``start``."""
    order = parts[start:] + parts[:start]
    total = order[0].clone()
    for p in order[1:]:
        total = total + p
    return total


def _row_chunks(rows: int, chunks: int) -> list[slice]:
    bounds = torch.linspace(0, rows, chunks + 1).round().long().tolist()
    return [slice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _serial_and_coc(op: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, tp: int,
                    chunks: int) -> tuple[Any, ...]:
    """``(serial, coc, A, B, K, R, bias)`` of one op: ``truth = A @ B (+ bias)``, K and R of its bound."""
    m, k = x.shape
    if op in ("matmul_all_reduce", "matmul_reduce_scatter"):
        xs, ws = x.chunk(tp, dim=1), w.chunk(tp, dim=0)
        rows = slice(0, m) if op == "matmul_all_reduce" else slice(0, m // tp)  # rank 0's shard
        serial = _ring_sum([xr[rows] @ wr for xr, wr in zip(xs, ws)], 0) + bias
        pieces = [_ring_sum([xr[rows][c] @ wr for xr, wr in zip(xs, ws)], i % tp) + bias
                  for i, c in enumerate(_row_chunks(rows.stop, chunks))]
        return serial, torch.cat(pieces), x[rows], w, k, ops.roundings(tp), bias
    if op == "all_gather_matmul":
        cols = slice(0, w.shape[1] // tp)  # rank 0's column shard
        shard, bias = w[:, cols], bias[cols]
        serial = x @ shard + bias
        blocks = x.chunk(tp, dim=0)  # one block per rank, arriving in ring order
        pieces = [blk[c] @ shard + bias for blk in blocks for c in _row_chunks(blk.shape[0], max(chunks // tp, 1))]
        return serial, torch.cat(pieces), x, shard, k, ops.roundings(tp), bias
    # weight_grad: dW = dy^T @ x over m tokens, the reduction the chunking splits
    dy_t = torch.randn(m, w.shape[1], generator=torch.Generator().manual_seed(m)).to(x.dtype).to(x.device)
    serial = dy_t.T @ x
    pieces = [dy_t[c].T @ x[c] for c in _row_chunks(m, chunks)]
    coc = pieces[0].clone()
    for p in pieces[1:]:
        coc = coc + p
    return serial, coc, dy_t.T, x, m, layers.roundings(tp, chunks, "column"), None


def measure(op: str, dtype: torch.dtype, tp: int, m: int, k: int, n: int, chunks: int, data: str,
            device: str, reduced: bool) -> Point:
    """One configuration: the chunked result judged against float64 truth under the suite's bound."""
    x, w, bias = _operands(m, k, n, dtype, data, device, seed=m * 31 + tp)
    serial, coc, a, b, reduction_len, roundings, bias = _serial_and_coc(op, x, w, bias, tp, chunks)
    a64, b64 = a.double(), b.double()
    truth = a64 @ b64 + (0.0 if bias is None else bias.double())
    magnitude = a64.abs() @ b64.abs()
    cmp = numerics.compare(op, coc, truth, serial, magnitude=magnitude, reduction_len=reduction_len,
                           roundings=roundings, dtype=dtype)
    s = cmp.stats
    return Point(op, str(dtype).replace("torch.", ""), tp, m, chunks, data, reduced, s.worst_ratio,
                 s.violations, s.serial_rel_l2, s.rel_l2)


_REDUCED_FLAGS = ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


def sweep(args: argparse.Namespace) -> Iterator[Point]:
    """Every point of the grid; on CUDA each with reduced-precision split-K reductions on and off."""
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    cuda = args.device.startswith("cuda")
    matmul = torch.backends.cuda.matmul
    saved = {flag: getattr(matmul, flag) for flag in _REDUCED_FLAGS}
    grid = itertools.product(args.ops.split(","), dtypes, _ints(args.tp), _ints(args.m), _ints(args.chunks),
                             args.data.split(","), (True, False) if cuda else (True,))
    try:
        for op, dtype, tp, m, chunks, data, reduced in grid:
            if dtype == torch.float32 and not reduced:
                continue  # the flags are about half precision only
            if cuda:
                for flag in _REDUCED_FLAGS:
                    setattr(matmul, flag, reduced)
            yield measure(op, dtype, tp, m, args.k, args.n, chunks, data, args.device, reduced)
    finally:
        for flag, value in saved.items():
            setattr(matmul, flag, value)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench bounds",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--ops", default=",".join(BOUND_OPS))
    parser.add_argument("--tp", default="2,8")
    parser.add_argument("--m", default="1024,4096,8192", help="rows (tokens); several, the kernels differ")
    parser.add_argument("--chunks", default="2,7")
    parser.add_argument("--data", default=",".join(DATA))
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--tf32", action="store_true",
                        help="let float32 GEMMs use TF32 (serial and chunked alike, as a global flag does)")
    parser.add_argument("--json", help="write every point here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
    points = []
    print(f"device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    print(f"{'op':<22} {'dtype':<9} {'tp':>2} {'m':>5} {'chunks':>6} {'data':<8} {'rpr':>3} "
          f"{'worst/bound':>11} {'viol':>5} {'serial rel_l2':>13} {'coc rel_l2':>10}")
    for p in sweep(args):
        points.append(p)
        print(f"{p.op:<22} {p.dtype:<9} {p.tp:>2} {p.m:>5} {p.chunks:>6} {p.data:<8} "
              f"{'on' if p.reduced_precision_reduction else 'off':>3} {p.worst_ratio:>11.3f} {p.violations:>5} "
              f"{p.serial_rel_l2:>13.2e} {p.coc_rel_l2:>10.2e}", flush=True)
    worst = max(points, key=lambda p: p.worst_ratio)
    failing = sum(p.violations > 0 for p in points)
    print(f"{len(points)} points, worst/bound max {worst.worst_ratio:.3f} ({worst.op} {worst.dtype} tp{worst.tp} "
          f"m{worst.m} chunks{worst.chunks} {worst.data}), {failing} with violations")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(p) for p in points], f, indent=1)
    print(json.dumps({"points": len(points), "worst_ratio": round(worst.worst_ratio, 4),
                      "with_violations": failing}))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
