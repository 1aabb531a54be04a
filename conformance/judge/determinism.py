"""The two verdicts of ``deterministic=True``, and what a case needs to be able to reach them.

As HCCL, cuBLAS and Megatron define it (``docs/DESIGN.md#fused-ops``):

* **deterministic** (MUST where the mode is offered): every result of one call
  under one tiling -- run after run, ranks arriving in other orders, some of
  them late -- bitwise the first (:func:`check_reproducible`);
* **split-invariant** (MUST where ``split_invariant_ops`` declares it, as
  torch_npu's consistency levels promise): the result of every tiling bitwise
  the first tiling's (:func:`check_split_invariant`).  Where it is not
  declared, the tilings are judged by the error bound, as any result.

A case proves either only if it can fail (the lesson of vLLM's batch-invariance
tests: a green result that could not have been red proves nothing).  It
cannot where every result is equal by construction: exact data (any order of
its sums is exact), one result per tiling, identical tilings, or data whose
sums give the same bits in any order -- a TP sum of two ranks (``a + b ==
b + a``), partials of one magnitude cast to half precision, a GEMM's ``k``
sum cut otherwise (:func:`blind_to`).  :func:`cannot_fail` says which; the
fixed suite calls such a case a suite error, and the explorer builds none
(:func:`nothing_to_compare`, by its spec alone).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OpRun
from conformance.contract.layouts import OPERAND_SPLITS, shard
from conformance.contract.problems import Problem, global_operands
from conformance.contract.results import OpRunOutcome
from conformance.judge.failures import DeterminismViolation

#: HCCL's switch for a fixed reduction order (HCCL environment variable reference, "HCCL_DETERMINISTIC").
HCCL_DETERMINISTIC = "HCCL_DETERMINISTIC"


def arrival_ordered(backend: str | None, environ: Mapping[str, str]) -> str:
    """Why ``backend``'s reductions give bits that depend on the order the ranks reach them ("" when they do not):
    HCCL's, unless ``HCCL_DETERMINISTIC`` is ``true`` or ``strict``.  Bits of code that reduces through such a
    backend differ run to run whatever the code does, so only a mode that promises determinism by itself
    (``deterministic=True``) is judged for it there."""
    value = environ.get(HCCL_DETERMINISTIC)
    if backend == "hccl" and (value or "").lower() not in ("true", "strict"):
        return (f"hccl reduces in the order the ranks arrive unless {HCCL_DETERMINISTIC} is true or strict "
                f"({'unset' if value is None else repr(value)} here): the bits of its reductions change run to run "
                "whatever the implementation does")
    return ""


def nothing_to_compare(*, runs: int, exact: bool) -> str:
    """Why a deterministic case of ``runs`` results per tiling (of exact data or not) cannot show a result that
    differs ("" when it can)."""
    if exact:
        return "exact data sums to the same bits in any order: no reordering shows"
    if runs < 2:
        return "one run per tiling: no result to be reproducible against"
    return ""


def blind_to(problem: Problem, op: str, tp: int) -> str:
    """What of a reordering ``problem``'s data cannot show ("" when it shows both): its TP partials (float32, as a
    deterministic reduction keeps them) summed in rank order give, in its dtype, the bits of every other order tried
    (the reverse, each rotation) -- or of partials whose ``k`` sum was cut in two halves (as a GEMM may round a
    tile)."""
    operands = global_operands(problem)
    shards = [(shard(operands["x"], OPERAND_SPLITS[op]["x"], r, tp).float(),
               shard(operands["w"], OPERAND_SPLITS[op]["w"], r, tp).float()) for r in range(tp)]
    parts = [x @ w for x, w in shards]
    halves = [x[:, :x.shape[1] // 2] @ w[:x.shape[1] // 2] + x[:, x.shape[1] // 2:] @ w[x.shape[1] // 2:]
              for x, w in shards]
    bias = operands["bias"].float() if operands["bias"] is not None else 0

    def total(order: Sequence[int], partials: Sequence[torch.Tensor]) -> torch.Tensor:
        out = partials[order[0]].clone()
        for r in order[1:]:
            out += partials[r]
        return (out + bias).to(operands["x"].dtype)

    ranks = list(range(tp))
    first = total(ranks, parts)
    others = [ranks[::-1], *(ranks[i:] + ranks[:i] for i in range(1, tp))]
    if all(bitwise_equal(first, total(order, parts)) for order in others):
        return "the TP sum in any order"
    if bitwise_equal(first, total(ranks, halves)):
        return "a GEMM's k sum cut otherwise"
    return ""


def cannot_fail(run: OpRun) -> str:
    """Why the deterministic checks of ``run`` could not fail whatever the implementation did ("" when they can)."""
    why = nothing_to_compare(runs=run.runs, exact=any(p.exact for p in run.problems))
    if why:
        return why
    explicit = [t for t in run.tilings if t is not None]
    if len(set(explicit)) < len(explicit):
        return f"tilings {list(run.tilings)} repeat one another: a repeat is no other tiling"
    for problem in run.problems:
        blind = blind_to(problem, run.op, run.tp)
        if blind:
            return (f"{run.op} at TP {run.tp}: {problem} gives the same bits for {blind} (two ranks commute; spread "
                    "data at TP 3 or more does not): no reordering can show")
    return ""


def _results(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> Iterator[tuple[str, tuple[int, ...] | None, list[Any]]]:
    """``(where, tiling, that tiling's results run after run)`` for every rank, call and tiling."""
    for rank, o in enumerate(outcomes):
        for index, (call, problem) in enumerate(zip(o.calls, run.problems)):
            where = f"{run.op} {problem.dtype} rank {rank}" + (f" call {index}" if index else "")
            for t, tiling in enumerate(run.tilings):
                yield where, tiling, call.results[t * run.runs:(t + 1) * run.runs]


def _tiling(tiling: tuple[int, ...] | None) -> str:
    return "its own tiling" if tiling is None else f"tiling {list(tiling)}"


def check_reproducible(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> None:
    """Deterministic: every run of a call under one tiling bitwise the first run."""
    for where, tiling, results in _results(run, outcomes):
        for i, other in enumerate(results[1:], start=1):
            if not bitwise_equal(results[0], other):
                raise DeterminismViolation(f"{where}, {_tiling(tiling)}: run {i} differs bitwise from run 0 "
                                           f"({describe_difference(results[0], other)}); the same inputs, "
                                           "configuration and tiling must give the same bits whatever order the "
                                           "ranks arrive in")


def check_split_invariant(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> None:
    """Split-invariant: every tiling's first result bitwise the first tiling's."""
    firsts: dict[str, tuple[tuple[int, ...] | None, Any]] = {}
    for where, tiling, results in _results(run, outcomes):
        if where not in firsts:
            firsts[where] = (tiling, results[0])
            continue
        base_tiling, base = firsts[where]
        if not bitwise_equal(base, results[0]):
            raise DeterminismViolation(f"{where}: {_tiling(tiling)} differs bitwise from {_tiling(base_tiling)} "
                                       f"({describe_difference(base, results[0])}); split invariance "
                                       "(split_invariant_ops) promises the same bits for any tiling")
