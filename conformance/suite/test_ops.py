"""Fused-op conformance (``docs/DESIGN.md#fused-ops``): numerics, layouts, values, determinism, w8A16.

Each op is checked against the float64 truth with the live serial composition
(matmul, then the collective, in the same dtype) as the serial reference, on
every rank, and every result against the contract (``conformance.judge.ops``):

* golden cases at every TP size, weight stored as ``[k, n]`` and ``[n, k]``;
* token counts that are odd, prime, smaller than any tiling, or 1 -- correct
  numbers or a clear refusal on every rank, never silent wrong rows (fresh
  allocations are poisoned);
* exact data (small integers): results, chunk offsets and V2's gathered input
  compared bitwise;
* several calls back to back with different inputs and sizes, checked only
  at the end (results are values);
* TP groups that are proper subgroups of the world (contiguous and strided);
* stragglers: one rank, or random ranks, late at every collective.

``deterministic=True`` must equal the serial deterministic reference of
:mod:`conformance.cases.op_cases` bit for bit, whatever the tiling, the run,
or the order in which ranks reach each collective.  Deterministic shapes keep
``m >= 16`` and ``n`` a multiple of 16, where CPU BLAS gives every row the
same bits whatever the tiling.  An op that raises ``NotImplementedError`` for
a mode (deterministic, w8A16, explicit tiling) skips that case.
"""

from __future__ import annotations

from typing import Any

import pytest

import golden
from conformance.cases.groups import GROUP_LAYOUTS, SUBGROUP_SIZES
from conformance.cases.op_cases import op_task
from conformance.cases.quant_cases import BAD_QUANT, quant_task
from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OpRun, QuantRun
from conformance.contract.layouts import OPERAND_SPLITS
from conformance.contract.problems import Problem, exact_limit_ok
from conformance.judge import checks, numerics
from conformance.judge import ops as judge
from conformance.judge.assembly import assemble, copies
from conformance.judge.failures import DeterminismViolation, WrongError, suite_requires
from conformance.judge.levels import Level
from conformance.judge.op_verdicts import judge_op_run
from conformance.protocol import FUSED_OPS, Declarations
from golden.catalogue import DTYPES, TP_SIZES

OP_CASES: tuple[Any, ...] = golden.catalogue("op")
QUANT_CASES = golden.catalogue("w8a16")


def _requires(op: str) -> Any:
    return pytest.mark.coc_requires(op)


def _divisible(case: Any, op: str, tp: int) -> bool:
    p = case.params
    if op in ("matmul_all_reduce", "matmul_reduce_scatter"):  # k sharded; reduce-scatter also splits m
        return p["k"] % tp == 0 and (op != "matmul_reduce_scatter" or p["m"] % tp == 0)
    return p["m"] % tp == 0


def _golden_problem(case: Any) -> Problem:
    p = case.params
    return Problem(p["m"], p["k"], p["n"], p["dtype"], p["with_bias"], case_id=case.id)


def _run_checks(coc_ranks: Any, verdicts: Any, declared: Declarations, run: OpRun, *, world: int | None = None,
                exact: bool = False) -> list[Any]:
    outcomes = coc_ranks.run(op_task, world or run.tp, run=run)
    checks.skip_if_not_implemented(judge.call_errors(outcomes))
    judge_op_run(verdicts, run, outcomes, declared.in_place_ops, exact=exact)
    return outcomes


def _op_params() -> list[Any]:
    params = []
    for case in OP_CASES:
        for op in case.ops:
            for tp in TP_SIZES:
                if not _divisible(case, op, tp):
                    continue
                for transpose in (False, True):
                    params.append(pytest.param(case.id, op, tp, transpose, marks=_requires(op),
                                               id=f"{op}-{case.id}-tp{tp}" + ("-wT" if transpose else "")))
    return params


@pytest.mark.parametrize("case_id, op, tp, transpose", _op_params())
def test_op_matches_golden(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, case_id: str, op: str,
                           tp: int, transpose: bool) -> None:
    case = next(c for c in OP_CASES if c.id == case_id)
    run = OpRun(op, (_golden_problem(case),), tp, transpose_weight=transpose)
    _run_checks(coc_ranks, verdicts, coc_declarations, run)


#: Token counts that no tiling divides evenly: 1, smaller than any chunk count, odd, prime.
UNEVEN_ROWS = (1, 3, 7, 13, 61)


def _uneven_params() -> list[Any]:
    params = []
    for op in FUSED_OPS:
        for tp in (2, 8):
            params.append(pytest.param(op, tp, marks=_requires(op), id=f"{op}-tp{tp}"))
    return params


@pytest.mark.parametrize("op, tp", _uneven_params())
def test_uneven_token_counts(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, tp: int) -> None:
    """Odd, prime and tiny token counts: correct numbers or a clear refusal on every rank, never wrong rows.

    The all-reduce multiplies ``m`` rows on every rank; the gathers gather
    ``m`` rows from every rank; the reduce-scatter keeps ``m`` rows per rank
    (and ``m*tp + 1`` rows, which no scatter can split, must be refused).
    """
    rows = {"matmul_all_reduce": UNEVEN_ROWS, "matmul_reduce_scatter": tuple(r * tp for r in UNEVEN_ROWS),
            "all_gather_matmul": tuple(r * tp for r in UNEVEN_ROWS)}.get(op, tuple(r * tp for r in UNEVEN_ROWS))
    problems = tuple(Problem(m, 64, 48, "float32", seed=m) for m in rows)
    for problem in problems:
        run = OpRun(op, (problem,), tp)
        outcomes = coc_ranks.run(op_task, tp, run=run)
        checks.skip_if_not_implemented(judge.call_errors(outcomes))
        errors = [o.calls[0].error for o in outcomes]
        if any(e is not None for e in errors):
            with verdicts.check(f"m={problem.m}: refused clearly", Level.MUST):
                checks.check_clear_refusal(errors, _issued(outcomes), what=f"{op} m={problem.m}",
                                           names=_refusal_names(problem.m, tp))
            with verdicts.check(f"m={problem.m}: declared shape error", Level.SHOULD):
                first = next(e for e in errors if e is not None)
                checks.check_declared_error(first, coc_declarations.error_type("shape"), kind="shape",
                                            what=f"{op} m={problem.m}")
            continue
        with verdicts.check(f"m={problem.m}: results are values", Level.MUST):
            judge.check_contract(run, outcomes, coc_declarations.in_place_ops)
        with verdicts.check(f"m={problem.m}: numerics", Level.MUST):
            judge.check_numerics(run, outcomes)
    if op == "matmul_reduce_scatter":
        bad = Problem(tp * 7 + 1, 64, 48, "float32")
        outcomes = coc_ranks.run(op_task, tp, run=OpRun(op, (bad,), tp))
        with verdicts.check(f"m={bad.m} (not a multiple of tp): refused", Level.MUST):
            checks.check_clear_refusal([o.calls[0].error for o in outcomes], _issued(outcomes), what=f"{op} m={bad.m}",
                                       names=_refusal_names(bad.m, tp))


def _issued(outcomes: list[Any]) -> list[list[str]]:
    """Per rank, the collectives its first call issued (before it raised, when it did)."""
    return [[c.kind for t in o.calls[0].timelines for c in t.collectives] for o in outcomes]


def _refusal_names(m: int, tp: int) -> list[str]:
    """What a refusal of ``m`` rows may name: the token count, tp, rows, the setting."""
    return [rf"\b{m}\b", rf"\b{m // tp}\b" if m >= tp else rf"\b{m}\b", r"\bm\b", r"\btp\b", r"\brows?\b",
            r"tokens?", r"chunk", r"tile|tiling|block"]


def _exact_params() -> list[Any]:
    return [pytest.param(op, dtype, tp, marks=_requires(op), id=f"{op}-{dtype}-tp{tp}")
            for op in FUSED_OPS for dtype in DTYPES for tp in (2, 8)]


@pytest.mark.parametrize("op, dtype, tp", _exact_params())
def test_exact_layout(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, impl_accepts_blocks: Any,
                      op: str, dtype: str, tp: int) -> None:
    """Exact data: rows land where one serial collective puts them, bit for bit, under any tiling."""
    problem = Problem(tp * 24, 64, 32, dtype, seed=3, exact=True)
    suite_requires(exact_limit_ok(problem), f"exact data {problem} exceeds what its dtype holds exactly")
    rows = problem.m // tp if op != "matmul_all_reduce" else problem.m
    tilings: tuple[tuple[int, ...] | None, ...] = (None,)
    if impl_accepts_blocks(op):
        tilings = (None, (rows,), (1, rows - 3, 2))
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, (problem,), tp, tilings=tilings), exact=True)


def _values_params() -> list[Any]:
    return [pytest.param(op, tp, marks=_requires(op), id=f"{op}-tp{tp}") for op in FUSED_OPS for tp in (2, 8)]


@pytest.mark.parametrize("op, tp", _values_params())
def test_results_are_values(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, tp: int) -> None:
    """Four calls back to back -- different inputs, different token counts, no synchronisation -- checked last."""
    sizes = (tp * 16, tp * 4, tp * 16, tp * 8)
    problems = tuple(Problem(m, 64, 32, "bfloat16", seed=i) for i, m in enumerate(sizes))
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, problems, tp))


#: (world, tp): TP 2 x DP 2, TP 2 x DP 4, TP 4 x DP 2.


def _subgroup_params() -> list[Any]:
    return [pytest.param(op, world, tp, layout, marks=_requires(op), id=f"{op}-world{world}-tp{tp}-{layout}")
            for op in FUSED_OPS for world, tp in SUBGROUP_SIZES for layout in GROUP_LAYOUTS]


@pytest.mark.parametrize("op, world, tp, layout", _subgroup_params())
def test_tp_subgroup_of_the_world(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str,
                                  world: int, tp: int, layout: str) -> None:
    """The TP group is a proper subgroup, and each replica has its own data: collectives must stay in it."""
    problem = Problem(tp * 16, 64, 32, "float32", seed=11)
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, (problem,), tp, layout=layout), world=world)


def _straggler_params() -> list[Any]:
    return [pytest.param(op, who, 4, marks=_requires(op), id=f"{op}-{who}-tp4")
            for op in FUSED_OPS for who in ("rank1", "random")]


@pytest.mark.parametrize("op, who, tp", _straggler_params())
def test_stragglers(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, who: str,
                    tp: int) -> None:
    """A late rank, before the call and before every collective inside it: the numbers still hold."""
    problem = Problem(tp * 16, 64, 32, "float32", seed=5)
    run = OpRun(op, (problem, problem.with_m(tp * 8)), tp, straggler_s=0.02,
                straggler_rank=1 if who == "rank1" else None)
    _run_checks(coc_ranks, verdicts, coc_declarations, run)


DETERMINISTIC_OPS = ("matmul_all_reduce", "matmul_reduce_scatter")


def _det_params() -> list[Any]:
    return [pytest.param(op, dtype, tp, marks=_requires(op), id=f"{op}-{dtype}-tp{tp}")
            for op in DETERMINISTIC_OPS for dtype in DTYPES for tp in (2, 4)]


def _tilings(rows: int) -> tuple[tuple[int, ...] | None, ...]:
    """Default tiling, one block, equal halves, and ragged blocks (1 row, 128-aligned, rest)."""
    tilings: list[tuple[int, ...] | None] = [None, (rows,)]
    if rows % 2 == 0:
        tilings.append((rows // 2,) * 2)
    if rows > 3:
        tilings.append((1, rows - 3, 2))
    return tuple(tilings)


@pytest.mark.parametrize("op, dtype, tp", _det_params())
def test_deterministic_is_bitwise_reproducible(coc_ranks: Any, impl_accepts_blocks: Any, op: str, dtype: str,
                                                tp: int) -> None:
    """Bitwise equal to the serial deterministic reference, over tilings, runs and late ranks.

    Each rank's result has 64 rows and ``n`` is a multiple of 16, where CPU
    BLAS gives a row the same bits whatever the tile it is computed in.
    """
    m = 64 * tp if op == "matmul_reduce_scatter" else 64
    problem = Problem(m, 96, 64, dtype, bias=dtype != "bfloat16", seed=17)
    rows = m // tp if op == "matmul_reduce_scatter" else m
    tilings = _tilings(rows) if impl_accepts_blocks(op) else (None,)
    run = OpRun(op, (problem,), tp, deterministic=True, tilings=tilings, runs=3, straggler_s=0.004,
                serial=False, reference=True)
    outcomes = coc_ranks.run(op_task, tp, run=run)
    checks.skip_if_not_implemented(judge.call_errors(outcomes))
    judge.check_ran(run, outcomes)
    for rank, o in enumerate(outcomes):
        name = f"{op} {dtype} rank {rank}"
        call = o.calls[0]
        checks.check_bitwise_equal(name, call.results, what="run/tiling")
        if not bitwise_equal(call.results[0], call.reference):
            raise DeterminismViolation(
                f"{name}: differs bitwise from the serial deterministic reference "
                f"({describe_difference(call.reference, call.results[0])})")


#: The storm breaker's capability of the w8A16 cases: its own path, apart from the plain op.
W8A16 = "op:matmul_all_reduce/w8a16"


def _quant_params() -> list[Any]:
    params = []
    for case in QUANT_CASES:
        for tp in TP_SIZES:
            k_local, g = case.params["k"] // tp, case.params["group_size"]
            if case.params["granularity"] == "per_group" and (k_local % g or g >= k_local):
                continue  # 32 <= g < k for the rank's own k
            params.append(pytest.param(case.id, tp, id=f"{case.id}-tp{tp}"))
    return params


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.coc_capability(W8A16)
@pytest.mark.parametrize("case_id, tp", _quant_params())
def test_w8a16_matches_dequantised_golden(coc_ranks: Any, case_id: str, tp: int) -> None:
    import torch

    from golden import serial

    g = golden.load(case_id)
    outcomes = coc_ranks.run(quant_task, tp, run=QuantRun(case_id, tp))
    errors = [o.error for o in outcomes]
    checks.skip_if_not_implemented(errors)
    raised = [(r, e) for r, e in enumerate(errors) if e is not None]
    if raised:
        raise WrongError(f"rank(s) {[r for r, _ in raised]} raised {raised[0][1].describe()}")
    p = g.params
    scale = g.inputs["scale"]
    offset = g.inputs.get("offset")
    wf = serial.dequantize(torch.from_numpy(g.inputs["w"].astype("float64")), torch.from_numpy(
        scale.astype("float64")), None if offset is None else torch.from_numpy(offset.astype("float64")),
        p["group_size"]).numpy()
    envelope = (numerics.magnitude(g.inputs["x"], wf) + (abs(g.inputs["bias"]) if "bias" in g.inputs else 0), p["k"])
    split = OPERAND_SPLITS["matmul_all_reduce"]["y"]
    serial_y = assemble([o.serial for o in outcomes], split)
    for holders, out in copies([o.results[0] for o in outcomes], split):
        # The dequantised weight is rounded to the activation dtype once more.
        checks.check_close(", ".join(filter(None, ("y", holders))), out, g.outputs["y"], serial_y, envelope, g.dtype,
                           roundings=judge.roundings(tp) + 1)


#: What each refusal's message must name.
BAD_QUANT_NAMES = {"scale-shape": "scale", "offset-shape": "offset", "offset-without-scale": "offset",
                   "group-not-multiple-of-32": "group", "group-rows-wrong": "scale|group",
                   "group-not-below-k": "group", "float32-activations": "float32|dtype|x",
                   "int8-without-scale": "scale|int8"}


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.coc_capability(W8A16)
@pytest.mark.parametrize("tp", [2])
@pytest.mark.parametrize("change", BAD_QUANT)
def test_w8a16_bad_arguments_refused_on_every_rank(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations,
                                                   change: str, tp: int) -> None:
    case_id = next(c.id for c in QUANT_CASES if c.params["dtype"] == "float16" and c.params["k"] == 512)
    outcomes = coc_ranks.run(quant_task, tp, run=QuantRun(case_id, tp, change))
    errors = [o.error for o in outcomes]
    checks.skip_if_not_implemented(errors)
    with verdicts.check("refused, naming the argument", Level.MUST):
        checks.check_refused_on_every_rank(errors, what=f"w8A16 {change}", patterns=[BAD_QUANT_NAMES[change]])
    if errors[0] is not None:
        with verdicts.check("declared error type", Level.SHOULD):
            checks.check_declared_error(errors[0], coc_declarations.error_type("argument"), kind="argument",
                                        what=f"w8A16 {change}")
