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
* stragglers: one rank, or random ranks, late at every collective;
* corners of the case space, where real kernels change behaviour: ``n`` = 43
  (no multiple of 8), 4096 rows gathered, TP 1, strided operands (a ``.t()``
  weight view, column slices, storage offsets: correct numbers or a clear
  refusal on every rank), three calls of one shape, two different ops one
  after the other with both results kept, w8A16 group size 128 -- truth in
  float64 from seeded inputs, no stored golden.

``deterministic=True`` must give the same bits run after run for the same
inputs and tiling, whatever order the ranks reach each collective in; the
same bits across tilings only where the implementation declares split
invariance (``split_invariant_ops``), each tiling within the error bound
otherwise (``conformance/judge/determinism.py``).  An op that raises
``NotImplementedError`` for a mode (deterministic, w8A16, explicit tiling)
does not offer it: that case skips as not offered, or that sub-case (one
token count, one op of a sequence) is recorded not offered while the others
are judged (``sort_refusals``: the one refusal rule the explorer and the
corpus judge by too); a failure recorded before stays a failure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import golden
from conformance import case_kinds
from conformance.cases.op_cases import op_sequence_task, op_task
from conformance.cases.quant_cases import BAD_QUANT, quant_inputs, quant_task
from conformance.contract.jobs import OpRun, QuantRun
from conformance.contract.problems import Problem, QuantProblem, exact_limit_ok
from conformance.judge import checks
from conformance.judge import ops as judge
from conformance.judge.determinism import cannot_fail, digests
from conformance.judge.op_verdicts import (
    issued,
    judge_across_launches,
    judge_deterministic,
    judge_op_runs,
    refusal_names,
    refusal_rule,
    sort_refusals,
)
from conformance.judge.quant_verdicts import check_w8a16, judge_bad_argument, quant_truth
from conformance.protocol import Declarations
from conformance.record import report_properties
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import suite_requires
from conformance.record.levels import Level
from conformance.suite import op_params

pytestmark = pytest.mark.coc_kind(case_kinds.OP)


def _run_checks(coc_ranks: Any, verdicts: Any, declared: Declarations, run: OpRun, *, world: int | None = None,
                exact: bool = False) -> list[Any]:
    outcomes = coc_ranks.run(op_task, world or run.tp, run=run)
    _judge(verdicts, declared, [(run, outcomes)], exact=exact)
    return outcomes


def _judge(verdicts: Any, declared: Declarations, judged: list[tuple[OpRun, list[Any]]], *,
           exact: bool = False) -> list[tuple[OpRun, Any]]:
    """The op checks of every ``(run, its outcomes on every rank)``, after the one refusal rule
    (``sort_refusals``: a run the implementation does not offer, a refusal the rule allows); the runs judged."""
    to_judge = sort_refusals(verdicts, judged, declared).to_judge
    judge_op_runs(verdicts, to_judge, declared.in_place_ops, exact=exact)
    return to_judge


def _numbers_or_clear_refusal(coc_ranks: Any, verdicts: Any, declared: Declarations, run: OpRun, *,
                              label: str = "") -> None:
    """MUST: correct numbers, or a clear refusal on every rank (SHOULD: of the declared kind of error).

    For the cases the one refusal rule (``refusal_rule``: token counts no even
    tiling divides, strided operands) lets an implementation refuse: never
    silent wrong rows.
    """
    suite_requires(refusal_rule(run) is not None, f"{run}: a case the refusal rule lets no implementation refuse")
    ran = coc_ranks.run(op_task, run.tp, run=run)
    for judged, outcomes in sort_refusals(verdicts, [(run, ran)], declared, label=label).to_judge:
        with verdicts.check(f"{label}: results are values", Level.MUST):
            judge.check_contract(judged, outcomes, declared.in_place_ops)
        with verdicts.check(f"{label}: numerics", Level.MUST):
            judge.check_numerics(judged, outcomes, evidence=verdicts.evidence)


@pytest.mark.parametrize("case_id, op, tp, transpose", op_params.golden_params())
def test_op_matches_golden(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, case_id: str, op: str,
                           tp: int, transpose: bool) -> None:
    case = next(c for c in op_params.OP_CASES if c.id == case_id)
    run = OpRun(op, (op_params.golden_problem(case),), tp, transpose_weight=transpose)
    _run_checks(coc_ranks, verdicts, coc_declarations, run)


@pytest.mark.parametrize("op, tp", op_params.uneven_params())
def test_uneven_token_counts(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, tp: int) -> None:
    """Odd, prime and tiny token counts: correct numbers or a clear refusal on every rank, never wrong rows.

    The all-reduce multiplies ``m`` rows on every rank; the gathers gather
    ``m`` rows from every rank; the reduce-scatter keeps ``m`` rows per rank
    (and ``m*tp + 1`` rows, which no scatter can split, must be refused).
    """
    uneven = op_params.UNEVEN_ROWS
    rows = uneven if op == "matmul_all_reduce" else tuple(r * tp for r in uneven)
    for problem in (Problem(m, 64, 48, "float32", seed=m) for m in rows):
        label = f"m={problem.m}"
        with verdicts.sub_case(label):
            _numbers_or_clear_refusal(coc_ranks, verdicts, coc_declarations, OpRun(op, (problem,), tp), label=label)
    if op == "matmul_reduce_scatter":
        bad = Problem(tp * 7 + 1, 64, 48, "float32")
        outcomes = coc_ranks.run(op_task, tp, run=OpRun(op, (bad,), tp))
        with verdicts.check(f"m={bad.m} (not a multiple of tp): refused", Level.MUST):
            checks.check_clear_refusal([o.calls[0].error for o in outcomes], issued(outcomes), what=f"{op} m={bad.m}",
                                       names=refusal_names(bad.m, tp))


@pytest.mark.parametrize("op, dtype, tp", op_params.exact_params())
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


@pytest.mark.parametrize("op, tp", op_params.values_params())
def test_results_are_values(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, tp: int) -> None:
    """Four calls back to back -- different inputs, different token counts, no synchronisation -- checked last."""
    sizes = (tp * 16, tp * 4, tp * 16, tp * 8)
    problems = tuple(Problem(m, 64, 32, "bfloat16", seed=i) for i, m in enumerate(sizes))
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, problems, tp))


@pytest.mark.parametrize("op, world, tp, layout", op_params.subgroup_params())
def test_tp_subgroup_of_the_world(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str,
                                  world: int, tp: int, layout: str) -> None:
    """The TP group is a proper subgroup, and each replica has its own data: collectives must stay in it."""
    problem = Problem(tp * 16, 64, 32, "float32", seed=11)
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, (problem,), tp, layout=layout), world=world)


@pytest.mark.parametrize("op, who, tp", op_params.straggler_params())
def test_stragglers(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, who: str,
                    tp: int) -> None:
    """A late rank, before the call and before every collective inside it: the numbers still hold."""
    problem = Problem(tp * 16, 64, 32, "float32", seed=5)
    run = OpRun(op, (problem, problem.with_m(tp * 8)), tp, straggler_s=0.02,
                straggler_rank=1 if who == "rank1" else None)
    _run_checks(coc_ranks, verdicts, coc_declarations, run)


@pytest.mark.parametrize("op, dtype, tp", op_params.det_params())
def test_deterministic_is_bitwise_reproducible(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations,
                                                impl_accepts_blocks: Any, record_property: Any, op: str, dtype: str,
                                                tp: int) -> None:
    """The same bits run after run, with late ranks, under each tiling -- and in another launch, on fresh ranks
    with other late ranks; across tilings where declared split-invariant, each tiling within the error bound
    otherwise.  Each result's digest goes into the JSON summary, where ``coc-gate`` compares it with the
    baseline's (the same inputs, configuration, implementation code, device and torch).

    At TP 3 and 4 (a sum of two ranks is the same in either order) on spread
    data (cancelling columns of a wide exponent spread), where summing the
    partials in another order gives other bits in every dtype: the suite
    checks that it does, so that the case can fail.
    """
    m = 64 * tp if op == "matmul_reduce_scatter" else 64
    problem = Problem(m, 96, 64, dtype, bias=dtype != "bfloat16", seed=17, spread=True)
    rows = m // tp if op == "matmul_reduce_scatter" else m
    tilings = op_params.tilings(rows) if impl_accepts_blocks(op) else (None,)
    run = OpRun(op, (problem,), tp, deterministic=True, tilings=tilings, runs=3, straggler_s=0.004)
    why = cannot_fail(run)
    suite_requires(not why, f"a deterministic case that cannot fail: {why}")
    outcomes = coc_ranks.run(op_task, tp, run=run)
    judged = _judge(verdicts, coc_declarations, [(run, outcomes)])
    judge_deterministic(verdicts, judged, coc_declarations.split_invariant_ops)
    if not judged:
        return
    record_property(report_properties.DIGESTS, digests(run, outcomes))
    again = [coc_ranks.run(op_task, tp, fresh=True, run=replace(run, launch=1))] if coc_ranks.relaunches else []
    judge_across_launches(verdicts, [(run, [outcomes, *again])], why_not="" if again else
                          "this launcher starts no fresh ranks (threads of the session's process, or torchrun's job)")


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.coc_capability(op_params.W8A16)
@pytest.mark.coc_kind(case_kinds.W8A16)
@pytest.mark.parametrize("case_id, tp", op_params.quant_params())
def test_w8a16_matches_dequantised_golden(coc_ranks: Any, case_evidence: CaseEvidence, case_id: str, tp: int) -> None:
    g = golden.load(case_id)
    run = QuantRun(case_id, tp)
    check_w8a16(coc_ranks.run(quant_task, tp, run=run), run, quant_inputs(run), g.outputs["y"], evidence=case_evidence)


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.coc_capability(op_params.W8A16)
@pytest.mark.coc_kind(case_kinds.W8A16)
@pytest.mark.parametrize("tp", [2])
@pytest.mark.parametrize("change", BAD_QUANT)
def test_w8a16_bad_arguments_refused_on_every_rank(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations,
                                                   change: str, tp: int) -> None:
    case_id = next(c.id for c in op_params.QUANT_CASES if c.params["dtype"] == "float16" and c.params["k"] == 512)
    outcomes = coc_ranks.run(quant_task, tp, run=QuantRun(case_id, tp, change))
    checks.require_offered([o.error for o in outcomes])
    judge_bad_argument(verdicts, outcomes, change, coc_declarations)


# --- corners of the case space: where real kernels change behaviour (docs/DESIGN.md#fused-ops) ---------------

#: n with a tail no tile of 8 or 16 columns covers.
ODD_N = 43
#: Rows of a large gather: past the sizes where kernels switch algorithm or tiling (small k and n keep it fast).
LARGE_ROWS = 4096


@pytest.mark.parametrize("op, tp", op_params.op_corner(2))
def test_corner_n_not_multiple_of_8(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str,
                                    tp: int) -> None:
    """``n`` = 43: an epilogue in tiles of 8 or 16 columns must still write the tail."""
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, (Problem(tp * 8, 64, ODD_N, "float32", seed=23),),
                                                             tp))


@pytest.mark.parametrize("op, tp", op_params.op_corner(4))
def test_corner_large_gather(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str,
                             tp: int) -> None:
    """4096 rows gathered, scattered or reduced: the sizes where a kernel switches algorithm."""
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, (Problem(LARGE_ROWS, 16, 16, "float32", seed=24),),
                                                             tp))


@pytest.mark.parametrize("op, tp", op_params.op_corner(1))
def test_corner_tp1(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str, tp: int) -> None:
    """TP 1: a group of one rank (a CoC op is called at any TP): the op is the plain matmul."""
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, (Problem(24, 64, 48, "float32", seed=25),), tp))


@pytest.mark.parametrize("op, strides, tp", op_params.strided_params())
def test_corner_strided_operands(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str,
                                 strides: str, tp: int) -> None:
    """A ``.t()`` weight view, column slices of wider buffers, storage offsets (NaN around every view).

    Correct numbers or a clear refusal on every rank (MUST): a kernel that
    reads storage as if it were contiguous from its start gets wrong numbers.
    """
    run = OpRun(op, (Problem(tp * 16, 64, 32, "float32", seed=26),), tp, strides=strides)
    _numbers_or_clear_refusal(coc_ranks, verdicts, coc_declarations, run)


@pytest.mark.parametrize("op, tp", op_params.op_corner(2))
def test_corner_same_shape_calls(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, op: str,
                                 tp: int) -> None:
    """Three calls of one shape in a row, every result kept: a double-buffered workspace runs out on the third."""
    problems = tuple(Problem(tp * 8, 64, 32, "bfloat16", seed=27 + i) for i in range(3))
    _run_checks(coc_ranks, verdicts, coc_declarations, OpRun(op, problems, tp))


@pytest.mark.coc_capability(op_params.OP_SEQUENCE)
@pytest.mark.parametrize("tp", [2], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("ops", op_params.sequence_params())
def test_corner_op_sequence(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, ops: tuple[str, ...],
                            tp: int) -> None:
    """Two different ops back to back, both results kept and judged last: no workspace shared between ops."""
    runs = tuple(OpRun(op, (Problem(tp * 16, 64, 32, "float32", seed=28 + i),), tp) for i, op in enumerate(ops))
    outcomes = coc_ranks.run(op_sequence_task, tp, runs=runs)
    _judge(verdicts, coc_declarations, [(run, [o[i] for o in outcomes]) for i, run in enumerate(runs)])


@pytest.mark.coc_requires("matmul_all_reduce")
@pytest.mark.coc_capability(op_params.W8A16)
@pytest.mark.coc_kind(case_kinds.W8A16)
@pytest.mark.parametrize("tp", [2], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("group_size", [128], ids=lambda g: f"g{g}")
def test_corner_w8a16_group_size(coc_ranks: Any, case_evidence: CaseEvidence, group_size: int, tp: int) -> None:
    """Per-group w8A16 at the common real group size, 128 (two groups per rank), with an offset and a bias."""
    problem = QuantProblem(16, 2 * group_size * tp, 48, "bfloat16", group_size, seed=30)
    run = QuantRun(None, tp, seeded=problem)
    quant = quant_inputs(run)
    check_w8a16(coc_ranks.run(quant_task, tp, run=run), run, quant, quant_truth(quant), evidence=case_evidence)
