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
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OpRun
from conformance.contract.layouts import OPERAND_SPLITS, Split, shard
from conformance.contract.problems import Problem, global_operands
from conformance.contract.results import OpRunOutcome
from conformance.judge.ops import returned_everywhere
from conformance.record.failures import DeterminismViolation

if TYPE_CHECKING:
    import torch

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


#: The rows of a call :func:`blind_to` multiplies.
ROWS_JUDGED = 128


def blind_to(problem: Problem, op: str, tp: int) -> str:
    """What of a reordering ``problem``'s data cannot show ("" when it shows both): its TP partials (float32, as a
    deterministic reduction keeps them) summed in rank order give, in its dtype, the bits of every other order tried
    (the reverse, each rotation) -- or of partials whose ``k`` sum was cut in two halves (as a GEMM may round a
    tile).  Judged on the first :data:`ROWS_JUDGED` rows: a row's sums are its own, and spread data puts its
    cancelling terms in every row alike (the explorer asks it of large calls, again and again while it shrinks)."""
    if tp < 3:  # one partial, or two: ``a + b == b + a``
        return "the TP sum in any order"
    operands = global_operands(problem)
    if OPERAND_SPLITS[op]["x"] is not Split.SEQ:  # rows are not what the ranks split
        operands = {**operands, "x": operands["x"][:ROWS_JUDGED]}
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
    """``(where, tiling, that tiling's results run after run)`` for every rank, call and tiling: the attempts that
    came back on every rank (one that raised on some rank is judged by "the op ran on every rank")."""
    for index, problem in enumerate(run.problems):
        everywhere = set(returned_everywhere(outcomes, index))
        for rank, o in enumerate(outcomes):
            call = o.calls[index]
            where = f"{run.op} {problem.dtype} rank {rank}" + (f" call {index}" if index else "")
            for t, tiling in enumerate(run.tilings):
                yield where, tiling, [call.results[j] for j in range(t * run.runs, (t + 1) * run.runs)
                                      if j in everywhere]


def _tiling(tiling: tuple[int, ...] | None) -> str:
    return "its own tiling" if tiling is None else f"tiling {list(tiling)}"


def check_reproducible(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> int:
    """Deterministic: every run of a call under one tiling bitwise the first run.  Returns how many results it
    compared with a first one (0: no tiling came back twice on every rank)."""
    compared = 0
    for where, tiling, results in _results(run, outcomes):
        for i, other in enumerate(results[1:], start=1):
            compared += 1
            if not bitwise_equal(results[0], other):
                raise DeterminismViolation(f"{where}, {_tiling(tiling)}: run {i} differs bitwise from run 0 "
                                           f"({describe_difference(results[0], other)}); the same inputs, "
                                           "configuration and tiling must give the same bits whatever order the "
                                           "ranks arrive in")
    return compared


def check_split_invariant(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> int:
    """Split-invariant: every tiling's first result bitwise the first tiling's.  Returns how many tilings it
    compared with a first one (0: fewer than two came back on every rank)."""
    firsts: dict[str, tuple[tuple[int, ...] | None, Any]] = {}
    compared = 0
    for where, tiling, results in _results(run, outcomes):
        if not results:
            continue
        if where not in firsts:
            firsts[where] = (tiling, results[0])
            continue
        base_tiling, base = firsts[where]
        compared += 1
        if not bitwise_equal(base, results[0]):
            raise DeterminismViolation(f"{where}: {_tiling(tiling)} differs bitwise from {_tiling(base_tiling)} "
                                       f"({describe_difference(base, results[0])}); split invariance "
                                       "(split_invariant_ops) promises the same bits for any tiling")
    return compared


def _firsts(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> dict[tuple[int, int], list[Any]]:
    """``(call, tiling)`` -> every rank's first result of it that came back on every rank."""
    found: dict[tuple[int, int], list[Any]] = {}
    for index in range(len(run.problems)):
        everywhere = returned_everywhere(outcomes, index)
        for t in range(len(run.tilings)):
            first = next((j for j in everywhere if t * run.runs <= j < (t + 1) * run.runs), None)
            if first is not None:
                found[(index, t)] = [o.calls[index].results[first] for o in outcomes]
    return found


def check_across_launches(run: OpRun, first: Sequence[OpRunOutcome], again: Sequence[OpRunOutcome]) -> int:
    """Deterministic across launches: the result of each call under each tiling on fresh ranks (another launch,
    other arrival orders and late ranks) bitwise the first launch's.  Returns how many it compared (0: none came
    back on every rank in both)."""
    before, after = _firsts(run, first), _firsts(run, again)
    compared = 0
    for (index, t), results in before.items():
        for rank, (one, other) in enumerate(zip(results, after.get((index, t), ()))):
            compared += 1
            if not bitwise_equal(one, other):
                where = f"{run.op} {run.problems[index].dtype} rank {rank}" + (f" call {index}" if index else "")
                raise DeterminismViolation(f"{where}, {_tiling(run.tilings[t])}: the result on fresh ranks (another "
                                           f"launch) differs bitwise from the first launch's "
                                           f"({describe_difference(one, other)}); the same inputs, configuration "
                                           "and tiling must give the same bits in every launch, not only within one "
                                           "process")
    return compared


def digests(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> list[dict[str, Any]]:
    """Each deterministic result's digest (every rank's first result of a call under a tiling, in rank order) with
    what it depends on of the case: its inputs and configuration (the environment -- the implementation's code,
    the device, torch -- is the run's).  ``coc-gate`` compares digests of two runs where all of that matches."""
    import hashlib

    import torch

    found = []
    for (index, t), results in _firsts(run, outcomes).items():
        digest = hashlib.sha256()
        for result in results:
            digest.update(result.contiguous().view(torch.uint8).numpy().tobytes() if isinstance(result, torch.Tensor)
                          else repr(result).encode())
        problem, tiling = run.problems[index], run.tilings[t]
        found.append({"op": run.op, "tp": run.tp, "layout": run.layout, "strides": run.strides,
                      "transpose_weight": run.transpose_weight, "tiling": None if tiling is None else list(tiling),
                      "problem": {k: v for k, v in asdict(problem).items() if k != "case_id"},
                      "digest": digest.hexdigest()})
    return found
