"""Which fixed op cases run (``conformance/suite/test_ops.py``): each test's parameters, every one marked with the
ops it needs (``coc_requires``), so a case of an op the implementation lacks is deselected, never failed."""

from __future__ import annotations

from typing import Any

import pytest

import golden
from conformance.cases.groups import GROUP_LAYOUTS, SUBGROUP_SIZES
from conformance.contract.jobs import OPERAND_STRIDES
from conformance.contract.problems import Problem
from conformance.protocol import DETERMINISTIC_OPS, FUSED_OPS
from golden.catalogue import DTYPES, TP_SIZES

OP_CASES: tuple[Any, ...] = golden.catalogue("op")
QUANT_CASES = golden.catalogue("w8a16")


def requires(op: str) -> Any:
    """The mark of a case that needs ``op``."""
    return pytest.mark.coc_requires(op)


def _divisible(case: Any, op: str, tp: int) -> bool:
    p = case.params
    if op in ("matmul_all_reduce", "matmul_reduce_scatter"):  # k sharded; reduce-scatter also splits m
        return p["k"] % tp == 0 and (op != "matmul_reduce_scatter" or p["m"] % tp == 0)
    return p["m"] % tp == 0


def golden_params() -> list[Any]:
    """Every golden case with every op it names, at every TP size its shapes split over, weight [k, n] and [n, k]."""
    params = []
    for case in OP_CASES:
        for op in case.ops:
            for tp in TP_SIZES:
                if not _divisible(case, op, tp):
                    continue
                for transpose in (False, True):
                    params.append(pytest.param(case.id, op, tp, transpose, marks=requires(op),
                                               id=f"{op}-{case.id}-tp{tp}" + ("-wT" if transpose else "")))
    return params


#: Token counts that no tiling divides evenly: 1, smaller than any chunk count, odd, prime.
UNEVEN_ROWS = (1, 3, 7, 13, 61)


def uneven_params() -> list[Any]:
    params = []
    for op in FUSED_OPS:
        for tp in (2, 8):
            params.append(pytest.param(op, tp, marks=requires(op), id=f"{op}-tp{tp}"))
    return params


def exact_params() -> list[Any]:
    return [pytest.param(op, dtype, tp, marks=requires(op), id=f"{op}-{dtype}-tp{tp}")
            for op in FUSED_OPS for dtype in DTYPES for tp in (2, 8)]


def values_params() -> list[Any]:
    return [pytest.param(op, tp, marks=requires(op), id=f"{op}-tp{tp}") for op in FUSED_OPS for tp in (2, 8)]


def subgroup_params() -> list[Any]:
    return [pytest.param(op, world, tp, layout, marks=requires(op), id=f"{op}-world{world}-tp{tp}-{layout}")
            for op in FUSED_OPS for world, tp in SUBGROUP_SIZES for layout in GROUP_LAYOUTS]


def straggler_params() -> list[Any]:
    return [pytest.param(op, who, 4, marks=requires(op), id=f"{op}-{who}-tp4")
            for op in FUSED_OPS for who in ("rank1", "random")]


def det_params() -> list[Any]:
    return [pytest.param(op, dtype, tp, marks=requires(op), id=f"{op}-{dtype}-tp{tp}")
            for op in DETERMINISTIC_OPS for dtype in DTYPES for tp in (3, 4)]


def quant_params() -> list[Any]:
    params = []
    for case in QUANT_CASES:
        for tp in TP_SIZES:
            k_local, g = case.params["k"] // tp, case.params["group_size"]
            if case.params["granularity"] == "per_group" and (k_local % g or g >= k_local):
                continue  # 32 <= g < k for the rank's own k
            params.append(pytest.param(case.id, tp, id=f"{case.id}-tp{tp}"))
    return params


def op_corner(tp: int) -> list[Any]:
    return [pytest.param(op, tp, marks=requires(op), id=f"{op}-tp{tp}") for op in FUSED_OPS]


def strided_params() -> list[Any]:
    return [pytest.param(op, strides, 2, marks=requires(op), id=f"{op}-{strides}-tp2")
            for op in FUSED_OPS for strides in OPERAND_STRIDES[1:]]


#: Two different ops one after the other: Megatron's SP MLP order (gather in, scatter out), and the reverse kinds.
OP_SEQUENCES = (("all_gather_matmul", "matmul_reduce_scatter"), ("matmul_all_reduce", "all_gather_matmul_v2"))


def golden_problem(case: Any) -> Problem:
    """The op problem of a golden case."""
    p = case.params
    return Problem(p["m"], p["k"], p["n"], p["dtype"], p["with_bias"], case_id=case.id)


def tilings(rows: int) -> tuple[tuple[int, ...] | None, ...]:
    """The tilings a deterministic case runs under: the default, one block, equal halves, and ragged blocks."""
    found: list[tuple[int, ...] | None] = [None, (rows,)]
    if rows % 2 == 0:
        found.append((rows // 2,) * 2)
    if rows > 3:
        found.append((1, rows - 3, 2))
    return tuple(found)


#: The storm breaker's capability of the w8A16 cases: its own path, apart from the plain op.
W8A16 = "op:matmul_all_reduce/w8a16"
#: The storm breaker's capability of op sequences: several ops' paths at once.
OP_SEQUENCE = "op:sequence"


def sequence_params() -> list[Any]:
    """Each of :data:`OP_SEQUENCES`, marked with both its ops."""
    return [pytest.param(ops, marks=[requires(op) for op in ops], id="-then-".join(ops)) for ops in OP_SEQUENCES]
