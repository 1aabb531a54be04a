"""Judging op outcomes: the result contract, results as values, numerics per replica, the wrong group.

Every call of an :class:`~conformance.cases.op_cases.OpRun` is judged at the
end, after all calls ran: its result must be a tensor of the op's shape,
dtype and device (MUST), complete when returned (no collective left
pending), never changed afterwards, sharing memory with no other result and
(unless declared in ``in_place_ops``) no input, and it must leave its inputs
unchanged; then its numbers are compared with the float64 truth of its
replica.  When they are wrong and the collectives ran on a group other than
the TP group -- or the numbers match a collective over the whole world --
the message says so (``docs/DESIGN.md#tp-subgroups``), as it says when they
match a bias added on every rank or a weight read in its other layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.contract.equality import bitwise_equal, describe_difference
from conformance.contract.jobs import OpRun
from conformance.contract.layouts import GATHERS, OPERAND_SPLITS, Split
from conformance.contract.problems import Problem
from conformance.contract.rank_errors import CapturedError
from conformance.contract.results import OpRunOutcome
from conformance.judge import assembly, checks, numerics
from conformance.judge.assembly import assemble, by_replica, copies
from conformance.judge.attempts import RAISED, sort_attempt
from conformance.judge.op_truth import misread, truth_of, wrong_group
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import ContractViolation, NumericMismatch, WrongError

if TYPE_CHECKING:
    import torch


def roundings(tp: int) -> int:
    """R for an op: summing the TP partials in the working dtype, the bias and the cast (row blocks add none)."""
    return numerics.tp_sum_roundings(tp) + 2


def expected_shape(op: str, problem: Problem, tp: int) -> tuple[int, int]:
    """This rank's result shape (the first one, for V2)."""
    if op == "matmul_reduce_scatter":
        return problem.m // tp, problem.n
    return problem.m, problem.n


#: (call, attempt of it): the problem's index, and its tiling and repeat (tiling * runs + run).
Attempt = tuple[int, int]


def attempts_of(outcomes: Sequence[OpRunOutcome]) -> dict[Attempt, list[CapturedError | None]]:
    """Every attempt of a run (``(call, attempt)``, in order) -> what it raised on each rank (None: returned)."""
    found: dict[Attempt, list[CapturedError | None]] = {}
    for o in outcomes:
        for i, call in enumerate(o.calls):
            for j, error in enumerate(call.errors):
                found.setdefault((i, j), []).append(error)
    return found


def attempt_label(run: OpRun, attempt: Attempt, *, repeat: bool = True) -> str:
    """``"call 1, tiling [1, 61, 2], repeat 2"``: which call of ``run`` an attempt is (its parts that vary; the
    repeat left out unless ``repeat``)."""
    i, j = attempt
    tiling = run.tilings[j // run.runs]
    parts = [f"call {i}" if len(run.problems) > 1 else "",
             ("its own tiling" if tiling is None else f"tiling {list(tiling)}") if len(run.tilings) > 1 else "",
             f"repeat {j % run.runs}" if run.runs > 1 and repeat else ""]
    return ", ".join(p for p in parts if p) or "the call"


def returned_everywhere(ranks: Sequence[OpRunOutcome], call: int) -> list[int]:
    """The attempts of call ``call`` that returned on every one of ``ranks``."""
    count = min((len(o.calls[call].errors) for o in ranks), default=0)
    return [j for j in range(count) if all(o.calls[call].errors[j] is None for o in ranks)]


def check_ran(run: OpRun, outcomes: Sequence[OpRunOutcome], excused: frozenset[Attempt] = frozenset()) -> None:
    """MUST: every attempt returned on every rank -- but those ``excused`` (refusals the case allows, judged as
    refusals) and those every rank refused with ``NotImplementedError`` (not offered)."""
    for attempt, errors in attempts_of(outcomes).items():
        if attempt in excused or sort_attempt(errors) != RAISED:
            continue
        rank, error = next((r, e) for r, e in enumerate(errors) if e is not None)
        problem = run.problems[attempt[0]]
        raise WrongError(f"{run.op} m={problem.m} k={problem.k} n={problem.n} {problem.dtype} "
                         f"{attempt_label(run, attempt)}: rank {rank} raised {error.describe()}\n{error.traceback}")


def check_contract(run: OpRun, outcomes: Sequence[OpRunOutcome], in_place_ops: frozenset[str] = frozenset()) -> None:
    """MUST: each result a rank got back is a value of the right type, shape, dtype and device; inputs untouched."""
    for rank, outcome in enumerate(outcomes):
        for i, (problem, call) in enumerate(zip(run.problems, outcome.calls)):
            where = f"{run.op} call {i} (m={problem.m}), rank {rank}"
            for j, result in enumerate(call.results):
                if call.errors[j] is not None:  # it raised: nothing came back
                    continue
                if call.wrong_device[j]:
                    raise ContractViolation(f"{where}: {call.wrong_device[j]}")
                _check_type(run.op, result, problem, run.tp, where)
                if call.changed_after_return[j]:
                    raise ContractViolation(f"{where}: the result changed after it was returned "
                                            f"({call.changed_after_return[j]}): a kept result must not be "
                                            "overwritten by later calls or by collectives still running")
                shared = call.shared_memory[j]
                if shared:
                    others = [s for s in shared.split(", ") if not (s.startswith("input") and run.op in in_place_ops)]
                    if others:
                        raise ContractViolation(f"{where}: the result shares memory with {', '.join(others)}"
                                                + ("" if run.op in in_place_ops else
                                                   " (not declared in in_place_ops)"))
            if call.mutated:
                raise ContractViolation(f"{where}: the op changed its inputs: "
                                        + "; ".join(f"{name}: {how}" for name, how in call.mutated.items()))
            pending = [c for t, e in zip(call.timelines, call.errors) if e is None for c in t.collectives if c.pending]
            if pending:
                raise ContractViolation(f"{where}: returned with {len(pending)} asynchronous collective(s) never "
                                        f"waited for ({[c.kind for c in pending]}): the result is not complete "
                                        "when returned")
        if outcome.groups_created > 0:
            raise ContractViolation(f"{run.op}, rank {rank}: {outcome.groups_created} process group(s) were "
                                    "created by calls after the first and never destroyed (a leak per call)")


def _check_type(op: str, result: Any, problem: Problem, tp: int, where: str) -> None:
    import torch

    value = result
    if op == "all_gather_matmul_v2":
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise ContractViolation(f"{where}: expected (output, gathered input), got {_kind(result)}")
        value = result[0]
        gathered = result[1]
        if not isinstance(gathered, torch.Tensor) or tuple(gathered.shape) != (problem.m, problem.k):
            raise ContractViolation(f"{where}: expected the gathered input as a tensor [{problem.m}, {problem.k}], "
                                    f"got {_kind(gathered)}")
    rows, n = expected_shape(op, problem, tp)
    dtype = getattr(torch, problem.dtype)
    if not isinstance(value, torch.Tensor):
        raise ContractViolation(f"{where}: expected a tensor [{rows}, {n}] {problem.dtype}, got {_kind(value)}")
    if tuple(value.shape) != (rows, n) or value.dtype != dtype:
        hint = ""
        if value.dim() == 2 and value.shape[0] != rows and value.shape[0] * tp != rows * tp:
            ratio = value.shape[0] / (problem.m / tp if op == "matmul_reduce_scatter" else problem.m) if rows else 0
            if op in GATHERS and ratio:
                hint = f" (rows of {value.shape[0] * tp // max(problem.m, 1)} ranks' shards were gathered)"
            elif op == "matmul_reduce_scatter" and value.shape[0]:
                hint = f" (the rows of a reduce-scatter over {problem.m // value.shape[0]} ranks)"
        raise ContractViolation(f"{where}: expected a tensor [{rows}, {n}] {dtype}, got {_kind(value)}{hint}")


def _kind(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a tensor {list(value.shape)} {value.dtype} on {value.device}"
    return f"{type(value).__name__} {value!r}"[:120]


def check_numerics(run: OpRun, outcomes: Sequence[OpRunOutcome], *, evidence: CaseEvidence, exact: bool = False
                   ) -> None:
    """MUST: every call's result within the bound of its replica's float64 truth (bitwise when ``exact``)."""
    import torch

    groups = by_replica(outcomes)
    split = OPERAND_SPLITS[run.op]["y"]
    for replica, ranks in groups.items():
        for i, problem in enumerate(run.problems):
            y, envelope, x = truth_of(problem, replica)
            for j in returned_everywhere(ranks, i):
                pieces = [_first(o.calls[i].results[j], run.op) for o in ranks]
                unusable = [_kind(p) for p in pieces if not isinstance(p, torch.Tensor) or p.device.type != "cpu"]
                if unusable:
                    raise NumericMismatch(f"{_label(run, i, replica, len(groups), j)}: cannot compare {unusable[0]} "
                                          "with the expected result (see the result contract)")
                try:
                    held = copies(pieces, split)
                except ContractViolation as failure:
                    raise ContractViolation(f"{_label(run, i, replica, len(groups), j)}: {failure}") from None
                for holders, out in held:
                    serial = (assemble([_first(o.calls[i].serial, run.op) for o in ranks], split)
                              if ranks[0].calls[i].serial is not None else out)
                    label = ", ".join(filter(None, (_label(run, i, replica, len(groups), j), holders)))
                    try:
                        if exact:
                            _check_exact(label, out, y, problem.dtype, split, run.tp)
                        else:
                            checks.check_close(label, out, y, serial, envelope, getattr(torch, problem.dtype),
                                               roundings=roundings(run.tp), evidence=evidence,
                                               split=split, tp=run.tp)
                    except NumericMismatch as failure:
                        raise NumericMismatch(f"{failure}{wrong_group(run, ranks, problem, out, replica, groups)}"
                                              f"{misread(run, problem, replica, out)}") from None
                label = _label(run, i, replica, len(groups), j)
                if run.op == "all_gather_matmul_v2":
                    for o in ranks:
                        gathered = o.calls[i].results[j][1]
                        _check_exact(f"{label}: rank {o.tp_rank}'s gathered input", gathered, x, problem.dtype,
                                     OPERAND_SPLITS[run.op]["x"], run.tp)


def replicated(run: OpRun) -> bool:
    """Whether ``run``'s results are replicated: held whole by every rank of a TP group of more than one."""
    return OPERAND_SPLITS[run.op]["y"] is Split.FULL and run.tp > 1


def check_identical_copies(run: OpRun, outcomes: Sequence[OpRunOutcome]) -> int:
    """SHOULD: where every rank of a replica holds the whole result, the copies are bitwise identical.

    Returns how many copies it compared with another (0: nothing was replicated, or no copy was a tensor on the
    CPU -- the result contract judges those).
    """
    import torch

    split = OPERAND_SPLITS[run.op]["y"]
    groups = by_replica(outcomes)
    compared = 0
    for replica, ranks in groups.items():
        for i in range(len(run.problems)):
            for j in returned_everywhere(ranks, i):
                pieces = [_first(o.calls[i].results[j], run.op) for o in ranks]
                if all(isinstance(p, torch.Tensor) and p.device.type == "cpu" for p in pieces):  # else the contract
                    compared += assembly.check_identical_copies(pieces, split, _label(run, i, replica, len(groups),
                                                                                      j),
                                                                _worst_ratio(run, ranks, i, replica))
    return compared


def _worst_ratio(run: OpRun, ranks: list[OpRunOutcome], i: int, replica: int) -> assembly.WorstRatio:
    """A copy of call ``i``'s replicated result -> its worst |error| / bound (for a replica mismatch's message)."""
    import torch

    problem = run.problems[i]

    def ratio(copy: torch.Tensor) -> float:
        y, envelope, _ = truth_of(problem, replica)
        serial = _first(ranks[0].calls[i].serial, run.op) if ranks[0].calls[i].serial is not None else y
        return numerics.compare("copy", copy, y, serial, magnitude=envelope[0], reduction_len=envelope[1],
                                roundings=roundings(run.tp), dtype=getattr(torch, problem.dtype)).stats.worst_ratio

    return ratio


def _first(result: Any, op: str) -> Any:
    return result[0] if op == "all_gather_matmul_v2" else result


def _label(run: OpRun, i: int, replica: int, replicas: int, j: int) -> str:
    problem = run.problems[i]
    parts = [f"{run.op} y [m={problem.m}]"]
    if len(run.problems) > 1:
        parts.append(f"call {i}")
    if replicas > 1:
        parts.append(f"replica {replica} (TP {run.tp} of a world of {run.tp * replicas}, {run.layout})")
    if j:
        parts.append(f"repeat {j}")
    return ", ".join(parts)


def _check_exact(label: str, out: Any, truth: np.ndarray, dtype: str, split: Any, tp: int) -> None:
    """Bitwise: exact data has exactly one correct answer in every summation order -- up to the sign of a zero,
    which the order decides (``-0 + 0`` is ``+0``, a sum of ``-0`` terms ``-0``): adding ``+0`` makes every zero
    ``+0`` and changes nothing else."""
    import torch

    expected = torch.from_numpy(np.asarray(truth)).to(getattr(torch, dtype))
    if not isinstance(out, torch.Tensor) or not bitwise_equal(out + 0, expected + 0):
        raise NumericMismatch(f"{label}: exact data must give exactly the exact result: "
                              f"{describe_difference(expected, out, split, tp)}")
