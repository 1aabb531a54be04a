"""Inputs of the generated cases: the same tensors on every rank and in the test process.

A case that does not use the stored goldens names its inputs by a
:class:`Problem` (shape, dtype, seed, data kind); :func:`global_operands`
rebuilds them anywhere from that alone, so ranks shard them and the test
process computes the float64 truth from them, without shipping tensors.

Two kinds of data (``docs/DESIGN.md#exact-data``):

* ``normal``: standard normal values rounded to the dtype (the error bound
  does the judging);
* ``exact``: small integers whose every product and every partial sum is
  exactly representable in the dtype, so a result is exact in any summation
  order and a misplaced, duplicated or stale block fails *bitwise*;
* ``spread``: the opposite, for determinism (``docs/DESIGN.md#fused-ops``):
  normal values, but the first quarter of ``x``'s columns scaled by
  :data:`SPREAD` (down :data:`SPREAD_BINADES` binades from column to column)
  and repeated, negated, one column past the middle, ``w``'s
  rows repeated alike.  Those terms cancel exactly in the true sum, but the
  TP partials of the first ranks and of the middle ones hold them (for
  ``tp >= 3``), so a sum's rounding depends on the order it adds the partials
  in -- and a GEMM's on the order it adds its terms -- down to bits the output
  dtype keeps, half precision included.  (Repeated rather than mirrored: a
  mirror makes the reverse order round exactly as the forward one.)

Each data-parallel replica gets different data (``replica`` shifts the seed),
so a collective over the wrong group gives wrong numbers, not the same ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


#: Largest |value| of exact data, per dtype: products and sums over k stay exact
#: (float16: 11 significand bits, bfloat16: 8, float32: 24).
EXACT_MAX = {"float32": 3, "float16": 2, "bfloat16": 1}


#: The scale of ``spread`` data's cancelling columns, per dtype: wide enough that the rounding of the float32 sums
#: holding them shows in the dtype's bits, narrow enough that the sums stay finite (float16 partials far below
#: 65504).
SPREAD = {"float32": 2.0**20, "bfloat16": 2.0**20, "float16": 2.0**8}


@dataclass(frozen=True)
class Problem:
    """Global operands ``X [m, k] @ W [k, n] (+ bias [n])`` of an op call, by recipe."""

    m: int
    k: int
    n: int
    dtype: str
    bias: bool = True
    seed: int = 0
    exact: bool = False
    case_id: str | None = None  #: take X, W and bias from this golden case instead
    spread: bool = False  #: cancelling columns of a wide exponent spread (module docstring)

    def with_m(self, m: int) -> Problem:
        return replace(self, m=m)


def _values(shape: tuple[int, ...], dtype: str, gen: torch.Generator, exact: bool) -> torch.Tensor:
    import torch

    if exact:
        top = EXACT_MAX[dtype]
        return torch.randint(-top, top + 1, shape, generator=gen).to(getattr(torch, dtype))
    return torch.randn(*shape, generator=gen).to(getattr(torch, dtype))


def global_operands(problem: Problem, replica: int = 0) -> dict[str, Any]:
    """``x``, ``w`` and ``bias`` (None without one) of ``problem`` for data-parallel ``replica``."""
    import torch

    if problem.case_id is not None:
        import golden

        g = golden.load(problem.case_id)
        x, w = g.tensor("x"), g.tensor("w")
        bias = g.tensor("bias") if "bias" in g.inputs else None
        if replica:
            x = x * 2.0 ** replica  # exact in every dtype, and different per replica
        return {"x": x, "w": w, "bias": bias}
    gen = torch.Generator().manual_seed(problem.seed * 1009 + replica * 7919 + problem.m)
    x = _values((problem.m, problem.k), problem.dtype, gen, problem.exact)
    w = _values((problem.k, problem.n), problem.dtype, gen, problem.exact)
    bias = _values((problem.n,), problem.dtype, gen, problem.exact) if problem.bias else None
    if problem.spread:
        x, w = _spread(x, w, SPREAD[problem.dtype])
    return {"x": x, "w": w, "bias": bias}


#: Binades the cancelling columns spread over below their scale: their products then need more bits than float32's
#: 24 to sum exactly, whatever the dtype's own (a bfloat16 product has 16).
SPREAD_BINADES = 12


def _spread(x: torch.Tensor, w: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x``'s first quarter of columns times ``scale`` (column ``j`` times ``2**-(j % SPREAD_BINADES)`` more),
    repeated negated one column past the middle; ``w``'s rows repeated alike: the two quarters' products cancel
    exactly, in every row and column.  One column past: no TP shard of the repeat is a shard of the first quarter
    negated, whose partial would cancel that shard's whatever its GEMM's rounding."""
    import torch

    quarter, start = x.shape[1] // 4, x.shape[1] // 2 + 1
    x, w = x.clone(), w.clone()
    if quarter:
        scales = scale * torch.exp2(-(torch.arange(quarter) % SPREAD_BINADES).float())
        x[:, :quarter] = (x[:, :quarter].float() * scales).to(x.dtype)
        x[:, start:start + quarter] = -x[:, :quarter]
        w[start:start + quarter] = w[:quarter]
    return x, w


def exact_limit_ok(problem: Problem) -> bool:
    """Whether exact data of ``problem`` really is exact (every sum below the dtype's integer range)."""
    top = EXACT_MAX[problem.dtype]
    largest = problem.k * top * top + (top if problem.bias else 0)
    return largest <= {"float32": 2**24, "float16": 2**11, "bfloat16": 2**8}[problem.dtype]


#: How w8A16 scales (and offsets) are laid out: one for the whole weight ``[1]``, one per column ``[n]``, one per
#: group of ``g`` rows and column ``[ceil(k/g), n]``.
GRANULARITIES = ("per_tensor", "per_channel", "per_group")


@dataclass(frozen=True)
class QuantProblem:
    """Seeded inputs of a w8A16 ``matmul_all_reduce``: ``x [m, k] @ ((w + offset) * scale) + bias``.

    ``w`` is int8 ``[k, n]``; ``scale`` and ``offset`` are laid out by
    ``granularity`` (per group: ``[ceil(k/g), n]``, row ``i`` of ``w`` using
    group ``i // g``; the golden w8A16 cases' recipe, without a stored golden).
    """

    m: int
    k: int
    n: int
    dtype: str
    group_size: int  #: per group only (0 otherwise)
    seed: int = 0
    granularity: str = "per_group"
    offset: bool = True
    bias: bool = True


def quant_operands(problem: QuantProblem) -> dict[str, Any]:
    """``x``, int8 ``w``, ``scale`` and, where the problem has them, ``offset`` and ``bias`` (the same on every
    rank)."""
    import torch

    gen = torch.Generator().manual_seed(problem.seed * 4099 + problem.group_size)
    dtype = getattr(torch, problem.dtype)
    rows = {"per_tensor": (1,), "per_channel": (problem.n,),
            "per_group": (-(-problem.k // max(problem.group_size, 1)), problem.n)}[problem.granularity]
    operands = {"x": torch.randn(problem.m, problem.k, generator=gen).to(dtype),
                "w": torch.randint(-128, 128, (problem.k, problem.n), generator=gen, dtype=torch.int8),
                # uniform in [0.5, 1.5) over int8's spread: dequantised weights ~ N(0, 1/k), as the goldens'
                "scale": ((torch.rand(*rows, generator=gen) + 0.5) / (74.0 * problem.k ** 0.5)).to(dtype),
                "offset": torch.randint(-64, 65, rows, generator=gen).to(dtype),
                "bias": torch.randn(problem.n, generator=gen).to(dtype)}
    return {name: t for name, t in operands.items() if getattr(problem, name, True)}


#: The layer kinds a layer problem builds (``mlp``: column -> gelu -> row).
LAYER_KINDS: tuple[str, ...] = ("column", "row", "mlp")


@dataclass(frozen=True)
class LayerProblem:
    """Global tensors of a layer case (``docs/DESIGN.md#layouts``), by recipe or from a golden case.

    ``layer`` is column, row or mlp (column -> gelu -> row); weights are Megatron's
    ``[out, in]``.  ``tokens`` lists the sequence length of each micro-batch
    (``b`` is shared); ``steps`` optimizer steps each change every weight by a
    seeded ``delta`` in place, as an optimizer would.
    """

    layer: str
    sequence_parallel: bool
    h_in: int
    h_out: int
    dtype: str
    b: int = 1
    tokens: tuple[int, ...] = (64,)
    ffn: int | None = None
    bias: bool = True
    seed: int = 0
    exact: bool = False
    case_id: str | None = None  #: take every tensor from this golden case (one micro-batch, one step)

    @property
    def weights(self) -> tuple[str, ...]:
        return ("w1", "b1", "w2", "b2") if self.layer == "mlp" else ("w", "b")

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        if self.layer == "mlp":
            assert self.ffn is not None
            return {"w1": (self.ffn, self.h_in), "b1": (self.ffn,), "w2": (self.h_out, self.ffn), "b2": (self.h_out,)}
        return {"w": (self.h_out, self.h_in), "b": (self.h_out,)}


def layer_weights(problem: LayerProblem, step: int = 0) -> dict[str, Any]:
    """The global weights (and biases, None without) at the start of optimizer ``step``."""
    import torch

    if problem.case_id is not None:
        import golden

        g = golden.load(problem.case_id)
        return {n: g.tensor(n) if n in g.inputs else None for n in problem.weights}
    gen = torch.Generator().manual_seed(problem.seed * 31 + 1)
    weights: dict[str, Any] = {}
    for name, shape in problem.weight_shapes().items():
        weights[name] = _values(shape, problem.dtype, gen, problem.exact) if (
            problem.bias or not name.startswith("b")) else None
    for s in range(step):
        for name, delta in layer_deltas(problem, s).items():
            weights[name] = (weights[name].double() + delta.double()).to(weights[name].dtype)
    return weights


def layer_deltas(problem: LayerProblem, step: int) -> dict[str, Any]:
    """What optimizer step ``step`` adds to each weight (an eighth of the weights' scale)."""
    import torch

    gen = torch.Generator().manual_seed(problem.seed * 31 + 1000 + step)
    return {name: (_values(shape, problem.dtype, gen, False).double() / 8).to(getattr(torch, problem.dtype))
            for name, shape in problem.weight_shapes().items()
            if problem.bias or not name.startswith("b")}


def layer_batch(problem: LayerProblem, micro: int, step: int = 0, replica: int = 0) -> dict[str, Any]:
    """``x [s, b, h_in]`` and ``dy [s, b, h_out]`` of one micro-batch of one step and replica."""
    import torch

    if problem.case_id is not None:
        import golden

        g = golden.load(problem.case_id)
        scale = 2.0 ** replica  # exact, and different per replica
        return {"x": g.tensor("x") * scale, "dy": g.tensor("dy") * scale}
    s = problem.tokens[micro]
    gen = torch.Generator().manual_seed(problem.seed * 7 + 100003 * replica + 1009 * step + 31 * micro + s)
    return {"x": _values((s, problem.b, problem.h_in), problem.dtype, gen, problem.exact),
            "dy": _values((s, problem.b, problem.h_out), problem.dtype, gen, problem.exact)}


def _main_grad_prefill(problem: LayerProblem, name: str, shape: Sequence[int], step: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(zlib.crc32(f"{problem.seed}/{name}/{step}".encode()))
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def main_grad_prefill(problem: LayerProblem, step: int) -> dict[str, Any]:
    """The global fp32 ``main_grad`` each weight starts step ``step`` with (fusion cases)."""
    return {n: _main_grad_prefill(problem, n, shape, step) for n, shape in problem.weight_shapes().items()
            if n.startswith("w")}
