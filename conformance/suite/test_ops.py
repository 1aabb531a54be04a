"""Fused-op conformance (SPEC §4, §6): numerics, layouts, determinism, w8A16, errors.

Each op is checked against the float64 golden with the live serial
composition (matmul, then the collective, in the same dtype) as the serial
reference, on every rank.  ``deterministic=True`` must equal the serial
deterministic reference of :mod:`conformance.cases.op_cases` bit for bit,
whatever the tiling, the run, or the order in which ranks reach each
collective.  Deterministic shapes keep ``m >= 16`` and ``n`` a multiple of 16,
where CPU BLAS gives every row the same bits whatever the tiling.
"""

from __future__ import annotations

from typing import Any

import pytest

import golden
from conformance import checks, numerics
from conformance.cases.op_cases import OPERAND_SPLITS, accepts, bad_quant_call, op_case, quant_case
from conformance.errors import DeterminismViolation
from conformance.layouts import assemble

TP_SIZES = (2, 4, 8)
OPS = ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2")
OP_CASES = golden.catalogue("op")
QUANT_CASES = golden.catalogue("w8a16")


def _divisible(case: Any, op: str, tp: int) -> bool:
    p = case.params
    if OPERAND_SPLITS[op]["x"].value == "last":  # k sharded; reduce-scatter also splits m
        return p["k"] % tp == 0 and (op != "matmul_reduce_scatter" or p["m"] % tp == 0)
    return p["m"] % tp == 0


def _op_params() -> list[Any]:
    params = []
    for case in OP_CASES:
        for op in case.ops:
            for tp in TP_SIZES:
                if not _divisible(case, op, tp):
                    continue
                for transpose in (False, True):
                    params.append(pytest.param(case.id, op, tp, transpose,
                                               marks=pytest.mark.coc_requires(op),
                                               id=f"{op}-{case.id}-tp{tp}" + ("-wT" if transpose else "")))
    return params


def _result(value: Any, op: str) -> Any:
    return value[0] if op == "all_gather_matmul_v2" else value


def roundings(tp: int) -> int:
    """R for an op: one rounding per TP partial, the bias and the cast (row blocks add none)."""
    return tp + 2


def _check_op(g: Any, op: str, outcomes: list[dict[str, Any]], index: int = 0) -> None:
    split = OPERAND_SPLITS[op]["y"]
    truth = g.outputs["y"]
    envelope = (numerics.magnitude(g.inputs["x"], g.inputs["w"])
                + (abs(g.inputs["bias"]) if "bias" in g.inputs else 0), g.params["k"])
    serial = assemble([_result(o["serial"], op) for o in outcomes], split, "serial y")
    out = assemble([_result(o["results"][index], op) for o in outcomes], split, f"{op} y")
    checks.check_close("y", out, truth, serial, envelope, g.dtype, roundings=roundings(len(outcomes)))


@pytest.mark.parametrize("case_id, op, tp, transpose", _op_params())
def test_op_matches_golden(coc_ranks: Any, case_id: str, op: str, tp: int, transpose: bool) -> None:
    g = golden.load(case_id)
    outcomes = coc_ranks.run(op_case, tp, case_id=case_id, op=op, transpose_weight=transpose)
    _check_op(g, op, outcomes)
    if op == "all_gather_matmul_v2":
        for rank, o in enumerate(outcomes):
            checks.check_bitwise_equal(f"rank {rank} gathered x", [o["serial"][1], o["results"][0][1]],
                                       what="(serial all-gather, V2's gathered input)")


def _det_params() -> list[Any]:
    params = []
    for case in OP_CASES:
        for op in ("matmul_all_reduce", "matmul_reduce_scatter"):
            if op in case.ops and case.params["n"] % 16 == 0:
                for tp in (2, 4):
                    params.append(pytest.param(case.id, op, tp, marks=pytest.mark.coc_requires(op),
                                               id=f"{op}-{case.id}-tp{tp}"))
    return params


def _tilings(rows: int) -> list[list[int] | None]:
    """Default tiling, one block, equal halves, and ragged blocks (1 row, 128-aligned, rest)."""
    tilings: list[list[int] | None] = [None, [rows]]
    if rows % 2 == 0:
        tilings.append([rows // 2] * 2)
    if rows > 3:
        tilings.append([1, rows - 3, 2])
    return tilings


@pytest.mark.parametrize("case_id, op, tp", _det_params())
def test_deterministic_is_bitwise_reproducible(coc_ranks: Any, case_id: str, op: str,
                                                tp: int, coc_impl: Any) -> None:
    g = golden.load(case_id)
    rows = g.params["m"] // tp if op == "matmul_reduce_scatter" else g.params["m"]
    tilings = _tilings(rows) if accepts(getattr(coc_impl, op), "blocks") else [None]
    outcomes = coc_ranks.run(op_case, tp, case_id=case_id, op=op, deterministic=True,
                             blocks_list=tilings, runs=3, delays=True, serial=False)
    for rank, o in enumerate(outcomes):
        name = f"{op} rank {rank}"
        checks.check_bitwise_equal(name, o["results"], what="run/tiling")
        if not checks._bitwise_equal(o["results"][0], o["reference"]):
            raise DeterminismViolation(
                f"{name}: differs bitwise from the serial deterministic reference "
                f"({checks._difference(o['reference'], o['results'][0])})")


def _quant_params() -> list[Any]:
    params = []
    for case in QUANT_CASES:
        for tp in TP_SIZES:
            k_local, g = case.params["k"] // tp, case.params["group_size"]
            if case.params["granularity"] == "per_group" and (k_local % g or g >= k_local):
                continue  # SPEC §4: 32 <= g < k for the rank's own k
            params.append(pytest.param(case.id, tp, id=f"{case.id}-tp{tp}"))
    return params


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.parametrize("case_id, tp", _quant_params())
def test_w8a16_matches_dequantised_golden(coc_ranks: Any, case_id: str, tp: int) -> None:
    g = golden.load(case_id)
    outcomes = coc_ranks.run(quant_case, tp, case_id=case_id)
    p = g.params
    scale = g.inputs["scale"]
    offset = g.inputs.get("offset")
    import torch

    from golden import serial

    wf = serial.dequantize(torch.from_numpy(g.inputs["w"].astype("float64")), torch.from_numpy(
        scale.astype("float64")), None if offset is None else torch.from_numpy(offset.astype("float64")),
        p["group_size"]).numpy()
    envelope = (numerics.magnitude(g.inputs["x"], wf)
                + (abs(g.inputs["bias"]) if "bias" in g.inputs else 0), p["k"])
    serial_y = assemble([o["serial"] for o in outcomes], OPERAND_SPLITS["matmul_all_reduce"]["y"])
    out = assemble([o["y"] for o in outcomes], OPERAND_SPLITS["matmul_all_reduce"]["y"], "w8A16 y")
    # The dequantised weight is rounded to the activation dtype once more.
    checks.check_close("y", out, g.outputs["y"], serial_y, envelope, g.dtype, roundings=roundings(tp) + 1)


BAD_QUANT = ["scale-shape", "offset-shape", "offset-without-scale", "group-not-multiple-of-32",
             "group-rows-wrong", "group-not-below-k", "float32-activations", "int8-without-scale"]
#: What each message must name.
BAD_QUANT_NAMES = {"scale-shape": "scale", "offset-shape": "offset", "offset-without-scale": "offset",
                   "group-not-multiple-of-32": "group", "group-rows-wrong": "scale|group",
                   "group-not-below-k": "group", "float32-activations": "float32|dtype|x",
                   "int8-without-scale": "scale|int8"}


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.parametrize("change", BAD_QUANT)
def test_w8a16_bad_arguments_raise_typed_error_on_every_rank(coc_ranks: Any, change: str) -> None:
    case_id = next(c.id for c in QUANT_CASES if c.params["dtype"] == "float16" and c.params["k"] == 512)
    results = coc_ranks.run(bad_quant_call, 2, case_id=case_id, change=change)
    checks.check_error_on_every_rank(results, type_name="ValueError|TypeError",
                                     patterns=[BAD_QUANT_NAMES[change]])
