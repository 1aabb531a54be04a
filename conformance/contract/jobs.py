"""What a rank task is asked to do: plain frozen values the suite builds and the rank side runs.

A job crosses the process boundary to every rank, so each is picklable data
(problems, sizes, flags); the rank tasks of :mod:`conformance.cases` take one
and return a result of :mod:`conformance.contract.results`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance.contract.problems import LayerProblem, Problem, QuantProblem

#: How an op's operands lie in memory (``docs/DESIGN.md#fused-ops``): the values are the same, the strides not.
#: ``weight-view``: ``w`` a transposed view (``.t()``) of storage laid out the other way round, as Megatron hands
#: ``weight.t()``; ``sliced``: ``x`` and ``w`` column slices of wider buffers (row stride > row length, a storage
#: offset); ``offset``: ``x``, ``w`` and the bias contiguous, but at a storage offset.
OPERAND_STRIDES: tuple[str, ...] = ("contiguous", "weight-view", "sliced", "offset")


@dataclass(frozen=True)
class OpRun:
    """What :func:`~conformance.cases.op_cases.op_task` does: calls of one op on one TP layout, and references."""

    op: str
    problems: tuple[Problem, ...]  #: one call per problem, back to back
    tp: int
    layout: str = "contiguous"
    strides: str = "contiguous"  #: one of :data:`OPERAND_STRIDES`
    transpose_weight: bool = False
    deterministic: bool = False
    #: Explicit tilings (``blocks=``) each problem is called with; None: the implementation's own.
    tilings: tuple[tuple[int, ...] | None, ...] = (None,)
    runs: int = 1
    #: Longest injected delay (seconds); 0: none.  ``straggler_rank`` None: random ranks.
    straggler_s: float = 0.0
    straggler_rank: int | None = None
    serial: bool = True
    poison: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  #: more keyword arguments of the op (w8A16)
    #: Which launch of the case this run is (0: the first): another launch runs on fresh ranks, its late ranks
    #: drawn from other seeds.
    launch: int = 0


@dataclass(frozen=True)
class QuantRun:
    """A w8A16 ``matmul_all_reduce`` of one golden case, or one made invalid by ``change``, or of seeded inputs."""

    case_id: str | None
    tp: int
    change: str | None = None
    seeded: QuantProblem | None = None  #: with no ``case_id``: the inputs' recipe


def coc_argv(chunks: int | str) -> list[str]:
    """Flags that enable scripted CoC with ``chunks`` chunks."""
    return ["--use-ascend-coc", "--coc-parallel-num", str(chunks)]


@dataclass(frozen=True)
class LayerJob:
    """What :func:`~conformance.cases.layer_cases.layer_task` runs: a problem, its TP size, the flags."""

    problem: LayerProblem
    tp: int
    argv: tuple[str, ...]
    coc_cfgs: Mapping[str, Any] | None = None
    runs: int = 1  #: CoC repeats of the whole thing (determinism)
    serial: bool = True
    steps: int = 1
    main_grad: bool = False  #: gradient-accumulation fusion into a pre-filled fp32 main_grad
    straggler_s: float = 0.0
    straggler_rank: int | None = None  #: None with ``straggler_s``: random ranks
    poison: bool = True
    autocast: str | None = None  #: run the layers under ``torch.autocast`` to this dtype (serial and CoC alike)
