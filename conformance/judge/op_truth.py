"""The float64 truth of an op call, and what a wrong result matches instead (named in a mismatch's message).

Of the ways a fused op commonly goes wrong, a mismatch's message names the
one its result matches: collectives on a group other than the TP group (or
an all-reduce over the whole world: ``docs/DESIGN.md#tp-subgroups``), a bias
added on every rank before the reduction, a weight read in its other layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.contract.jobs import OpRun
from conformance.contract.layouts import OPERAND_SPLITS, Split, shard
from conformance.contract.problems import Problem, global_operands
from conformance.contract.results import OpRunOutcome
from conformance.judge import numerics
from conformance.judge.group_notes import group_note


def truth_of(problem: Problem, replica: int) -> tuple[np.ndarray, tuple[np.ndarray, int], np.ndarray]:
    """``(y, (|X|@|W| + |bias|, K), X)`` in float64 for one replica's global operands."""
    t = global_operands(problem, replica)
    x, w = numerics.as_float64(t["x"]), numerics.as_float64(t["w"])
    bias = None if t["bias"] is None else numerics.as_float64(t["bias"])
    y = x @ w + (0 if bias is None else bias)
    magnitude = numerics.magnitude(x, w) + (0 if bias is None else np.abs(bias))
    return y, (magnitude, problem.k), x


def wrong_group(run: OpRun, ranks: list[OpRunOutcome], problem: Problem, out: Any, replica: int,
                 groups: dict[int, list[OpRunOutcome]]) -> str:
    """What the mismatch looks like when the TP group is a proper subgroup of the world."""
    note = group_note([c for o in ranks for call in o.calls for t in call.timelines for c in t.collectives],
                      ranks[0].members, "the implementation")
    if len(groups) > 1 and run.op == "matmul_all_reduce":
        world = sum(truth_of(problem, d)[0] - bias_of(problem, d) for d in groups) + bias_of(problem, replica)
        if np.allclose(numerics.as_float64(out), world, rtol=1e-2, atol=1e-2 * float(np.abs(world).max())):
            note += "; the result matches an all-reduce over the whole world (every replica summed)"
    return note


def misread(run: OpRun, problem: Problem, replica: int, out: Any) -> str:
    """What a wrong result matches, of the ways a fused kernel's operands are commonly misread: a bias added on
    every rank before the reduction (an MC2 all-reduce's documented formula), and the weight's storage read in
    the other layout (a kernel reads the transpose flag from the layout: a transposed weight handed over as a
    contiguous copy is another matrix).  "" when it matches neither."""
    import torch

    t = global_operands(problem, replica)
    x = numerics.as_float64(t["x"])
    bias = 0 if t["bias"] is None else numerics.as_float64(t["bias"])
    split = OPERAND_SPLITS[run.op]["w"]
    pieces = [shard(t["w"], split, r, run.tp) for r in range(run.tp)] if split is not Split.FULL else [t["w"]]
    # each rank's weight as it was stored ([n, k_r] when transposed, else [k_r, n]), read in the other layout
    read = [p.T.contiguous().reshape(p.shape) if run.transpose_weight else p.reshape(p.shape[1], p.shape[0]).T
            for p in pieces]
    stored = "[n, k] storage read as an ND [k, n] matrix (its transpose flag lost)" if run.transpose_weight else \
        "[k, n] storage read as the transposed view of an ND [n, k] tensor"
    candidates = [(x @ numerics.as_float64(torch.cat(read)) + bias, f"the weight's {stored}")]
    if t["bias"] is not None and run.tp > 1 and split is not Split.FULL:
        candidates.append((x @ numerics.as_float64(t["w"]) + run.tp * bias,
                           f"the bias added on each of the {run.tp} ranks before the reduction ({run.tp} times)"))
    got = numerics.as_float64(out)
    for candidate, what in candidates:
        if candidate.shape == got.shape and np.allclose(got, candidate, rtol=1e-2,
                                                        atol=1e-2 * float(np.abs(candidate).max())):
            return f"; the result matches {what}"
    return ""


def bias_of(problem: Problem, replica: int) -> Any:
    bias = global_operands(problem, replica)["bias"]
    return 0 if bias is None else numerics.as_float64(bias)
