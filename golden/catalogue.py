"""The fixed catalogue of golden cases.

Every case is a *global*, un-sharded problem: one stored golden serves every TP
size, and the conformance suite shards inputs/outputs itself. Shapes are chosen
so that every case can be sharded for each TP in ``TP_SIZES`` and then cut into
up to ``MAX_CHUNKS`` chunks per rank:

* layers: ``s % 8 == 0`` and ``m = s*b`` a multiple of 64 (SP shards ``s``, then
  CoC chunks the local ``m``); hidden sizes are multiples of 8;
* ops: ``m`` a multiple of 64 (reduce-scatter / all-gather row shards are
  chunked), ``k`` a multiple of 8 (all-reduce shards ``k``);
* w8A16 (all-reduce only, which never shards ``m``): ``m`` a multiple of 8 and
  ``k / tp`` a multiple of the group size, so groups never straddle shards.

A case's seed is derived from its id, so adding or reordering cases never
changes the inputs of existing ones.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

TP_SIZES: tuple[int, ...] = (2, 4, 8)
MAX_CHUNKS = 8
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")

Layer = Literal["column", "row", "mlp"]
Op = Literal["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul"]
Granularity = Literal["per_tensor", "per_channel", "per_group"]


class _Case:
    """Behaviour shared by all case kinds: id, seed and manifest params."""

    kind: ClassVar[str]
    checks: ClassVar[tuple[str, ...]]

    @property
    def id(self) -> str:
        raise NotImplementedError

    @property
    def seed(self) -> int:
        """Stable per-case seed for ``numpy.random.default_rng``."""
        return zlib.crc32(self.id.encode())

    @property
    def params(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


def _bias(with_bias: bool) -> str:
    return "bias" if with_bias else "nobias"


@dataclass(frozen=True)
class LayerCase(_Case):
    """A Megatron parallel linear layer (or column->GELU->row MLP), forward and backward.

    Inputs ``x [s, b, h_in]``, ``w [h_out, h_in]`` (Megatron ``[out, in]``), ``b [h_out]``,
    ``dy [s, b, h_out]``; outputs ``y, dx, dw, db``. For ``mlp`` the weights are
    ``w1 [ffn, h_in]``, ``w2 [h_out, ffn]`` with biases ``b1, b2`` and grads
    ``dw1, db1, dw2, db2``. ``sequence_parallel`` changes only how the suite shards
    ``x``/``y`` along ``s``, not the global maths.
    """

    layer: Layer
    sequence_parallel: bool
    s: int
    b: int
    h_in: int
    h_out: int
    dtype: str
    with_bias: bool
    ffn: int | None = None

    kind: ClassVar[str] = "layer"
    checks: ClassVar[tuple[str, ...]] = ("forward", "backward")

    @property
    def m(self) -> int:
        return self.s * self.b

    @property
    def id(self) -> str:
        sp = "sp" if self.sequence_parallel else "nosp"
        ffn = f"-ffn{self.ffn}" if self.ffn is not None else ""
        return (f"layer-{self.layer}-{sp}-s{self.s}b{self.b}-h{self.h_in}x{self.h_out}{ffn}"
                f"-{self.dtype}-{_bias(self.with_bias)}")


@dataclass(frozen=True)
class OpCase(_Case):
    """A fused op (``docs/DESIGN.md#fused-ops``) as one global product ``X [m, k] @ W [k, n] (+ bias [n])``.

    Sharding per TP rank r: all-reduce takes ``X[:, k-shard r]`` and ``W[k-shard r]``;
    reduce-scatter the same, rank r keeping rows ``r*m/tp ..``; all-gather takes
    ``X[row-shard r]`` and the whole ``W`` (and ``_v2`` also returns the gathered ``X``).
    """

    op: Op
    m: int
    k: int
    n: int
    dtype: str
    with_bias: bool

    kind: ClassVar[str] = "op"
    checks: ClassVar[tuple[str, ...]] = ("forward",)

    @property
    def ops(self) -> tuple[str, ...]:
        """The fused ops this golden serves (v2 adds only the gathered ``X``)."""
        return (self.op, "all_gather_matmul_v2") if self.op == "all_gather_matmul" else (self.op,)

    @property
    def id(self) -> str:
        return f"op-{self.op}-m{self.m}k{self.k}n{self.n}-{self.dtype}-{_bias(self.with_bias)}"


@dataclass(frozen=True)
class QuantCase(_Case):
    """w8A16 ``matmul_all_reduce``: ``X @ ((W + offset) * scale) (+ bias)``.

    ``w`` is int8 ``[k, n]``; ``scale``/``offset`` are ``[1]``, ``[n]`` or
    ``[ceil(k/g), n]`` for per-tensor, per-channel, per-group (``g = group_size``).
    """

    m: int
    k: int
    n: int
    dtype: str
    with_bias: bool
    granularity: Granularity
    with_offset: bool
    group_size: int | None = None
    op: Op = "matmul_all_reduce"

    kind: ClassVar[str] = "w8a16"
    checks: ClassVar[tuple[str, ...]] = ("forward",)

    @property
    def ops(self) -> tuple[str, ...]:
        return (self.op,)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """Shape of ``scale`` and ``offset``."""
        if self.granularity == "per_group":
            assert self.group_size is not None
            return (math.ceil(self.k / self.group_size), self.n)
        return (1,) if self.granularity == "per_tensor" else (self.n,)

    @property
    def id(self) -> str:
        group = f"g{self.group_size}" if self.group_size else ""
        offset = "offset" if self.with_offset else "nooffset"
        return (f"w8a16-{self.op}-m{self.m}k{self.k}n{self.n}-{self.granularity}{group}-{offset}"
                f"-{self.dtype}-{_bias(self.with_bias)}")


Case = LayerCase | OpCase | QuantCase

# (s, b, h_in, h_out, ffn); each dtype/SP combination takes the next shape in turn,
# so every layer sees a square weight (a transposition inferred from shapes is wrong there).
_LAYER_SHAPES: dict[str, tuple[tuple[int, int, int, int, int | None], ...]] = {
    "column": ((32, 2, 64, 96, None), (64, 1, 96, 48, None), (32, 2, 64, 64, None)),
    "row": ((64, 1, 96, 48, None), (32, 2, 48, 96, None), (64, 1, 64, 64, None)),
    "mlp": ((32, 2, 32, 32, 96), (64, 1, 48, 48, 64), (64, 1, 32, 32, 64)),
}

# (m, k, n) per op; the last shape is square.
_OP_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 96, 64), (128, 64, 48), (64, 64, 64))
# One case per op inside the documented domain of the fused kernels an NPU node runs (torch_npu's MC2: float16 /
# bfloat16, 256 <= k < 65535 of the rank's own x for reduce-scatter and all-gather, m a multiple of the TP size for
# reduce-scatter), at every TP size: the reduce-scatter shards k, so 2048 keeps k / 8 at 256.  General cases,
# valid on every device; on an NPU they are where the fused kernels run at all.
_KERNEL_DOMAIN_CASES: tuple[tuple[Op, int, int, int, str, bool], ...] = (
    ("matmul_all_reduce", 64, 512, 64, "float16", True),
    ("matmul_reduce_scatter", 64, 2048, 32, "bfloat16", False),
    ("all_gather_matmul", 64, 256, 64, "float16", True),
)


def _layer_cases() -> list[LayerCase]:
    cases = []
    for layer, shapes in _LAYER_SHAPES.items():
        for sp in (False, True):
            for i, dtype in enumerate(DTYPES):
                s, b, h_in, h_out, ffn = shapes[(i + sp) % len(shapes)]
                cases.append(LayerCase(layer, sp, s, b, h_in, h_out, dtype,  # type: ignore[arg-type]
                                       with_bias=not (sp and i == 1), ffn=ffn))
    return cases


def _op_cases() -> list[OpCase]:
    ops: tuple[Op, ...] = ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul")
    return [*(OpCase(op, *_OP_SHAPES[(i + j) % len(_OP_SHAPES)], dtype, with_bias=(i + j) % 3 != 1)
              for j, op in enumerate(ops) for i, dtype in enumerate(DTYPES)),
            *(OpCase(op, m, k, n, dtype, with_bias=bias) for op, m, k, n, dtype, bias in _KERNEL_DOMAIN_CASES)]


def _quant_cases() -> list[QuantCase]:
    # k / 8 must be a multiple of g: g=32 -> k=256, g=64 -> k=512.
    variants: tuple[tuple[Granularity, int | None, int], ...] = (
        ("per_tensor", None, 256), ("per_channel", None, 256),
        ("per_group", 32, 256), ("per_group", 64, 512))
    # Per granularity, the two dtypes between them cover every {offset, bias} combination.
    return [QuantCase(32, k, 32, dtype, with_bias=offset != (dtype == "float16"),
                      granularity=gran, with_offset=offset, group_size=g)
            for gran, g, k in variants for offset in (False, True)
            for dtype in ("float16", "bfloat16")]


CATALOGUE: tuple[Case, ...] = (*_layer_cases(), *_op_cases(), *_quant_cases())
