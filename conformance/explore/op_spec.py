"""The op kind's case: calls of the fused ops back to back, as plain data, and the suite's jobs it maps to.

A spec (:class:`OpSpec`) names global ``X [m, k] @ W [k, n] (+ bias)`` calls
by recipe (seeded data), so the same spec is the same case anywhere; a
sequence may mix ops, every result kept until the last call returned.  It
maps to the suite's own jobs (:class:`~conformance.contract.jobs.OpRun`, one
per stretch of one op) and says why it names no runnable case (sizes its
ops' TP split does not divide, a deterministic case that could not fail by
the fixed suite's rule).  How specs are drawn, simplified and judged is the
kind's (``conformance/explore/op_calls.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from conformance.cases.groups import GROUP_LAYOUTS
from conformance.contract.jobs import OPERAND_STRIDES, OpRun
from conformance.contract.problems import Problem, exact_limit_ok
from conformance.explore.spec import OnReplicas, SpecError, require_runnable
from conformance.judge.determinism import cannot_fail, nothing_to_compare
from conformance.judge.op_verdicts import rows_per_rank
from conformance.protocol import DETERMINISTIC_OPS, FUSED_OPS

#: The name of the kind in a spec's JSON.
KIND_NAME = "op"
#: The ops whose weight (``k``) is split over the TP ranks; the reduce-scatter also splits its rows.
K_SPLIT = ("matmul_all_reduce", "matmul_reduce_scatter")
#: Explicit tilings besides the implementation's own (``blocks=``), by recipe over a rank's result rows: the
#: implementation's own, one block, equal halves, ragged blocks (1 row, the rest, 2 rows).
TILINGS = ("own", "one", "halves", "ragged")


def split_sizes(op: str) -> tuple[str, ...]:
    """The sizes of a call ``op`` splits over the TP ranks (each must be a multiple of ``tp``)."""
    return (("k",) if op in K_SPLIT else ()) + (("m",) if op != "matmul_all_reduce" else ())


def tiling_blocks(recipe: str, rows: int) -> tuple[int, ...] | None:
    """The blocks of ``recipe`` over ``rows`` (None: the implementation's own; raises SpecError if none fit)."""
    if recipe == "own":
        return None
    if recipe == "one":
        return (rows,)
    if recipe == "halves" and rows % 2 == 0:
        return (rows // 2,) * 2
    if recipe == "ragged" and rows > 3:
        return (1, rows - 3, 2)
    raise SpecError(f"tiling {recipe!r} does not fit {rows} rows")


@dataclass(frozen=True)
class Call:
    """One call: ``op`` on global ``X [m, k] @ W [k, n] (+ bias)``, seeded data."""

    m: int
    k: int
    n: int
    dtype: str = "float32"
    bias: bool = True
    seed: int = 0
    op: str = "matmul_all_reduce"


@dataclass(frozen=True)
class OpSpec(OnReplicas):
    """Calls back to back (of one op, or several: a sequence) on a TP group of ``tp`` ranks in a world of
    ``tp * replicas``; every result kept and judged once the last call returned."""

    calls: tuple[Call, ...]
    tp: int
    replicas: int = 1
    layout: str = "contiguous"
    transpose_weight: bool = False
    strides: str = "contiguous"  #: how the operands lie in memory (:data:`OPERAND_STRIDES`)
    deterministic: bool = False
    exact: bool = False  #: small-integer data, every result judged bitwise (any summation order is exact)
    tiling: str = "own"  #: one of :data:`TILINGS`, besides the implementation's own
    runs: int = 1
    straggler_s: float = 0.0

    @property
    def ops(self) -> tuple[str, ...]:
        """The ops called, in order, each once."""
        return tuple(dict.fromkeys(c.op for c in self.calls))

    @property
    def capability(self) -> str:
        return f"op:{self.ops[0]}" if len(self.ops) == 1 else "op:sequence"

    def modes(self, ops: Sequence[str] | None = None) -> frozenset[str]:
        """What of the implementation a call of ``ops`` (default: every op called) needs: each op, and each mode
        of this spec an implementation may lack (``NotImplementedError``)."""
        modes = ["deterministic" if self.deterministic else "", "explicit tiling" if self.tiling != "own" else "",
                 "weight [n, k]" if self.transpose_weight else "",
                 f"{self.strides} operands" if self.strides != "contiguous" else ""]
        return frozenset(ops or self.ops) | {m for m in modes if m}

    def problem(self, call: Call) -> str:
        """Why ``call`` cannot run in this spec ("" when it can)."""
        if call.op not in FUSED_OPS:
            return f"unknown op {call.op!r}; known: {FUSED_OPS}"
        if min(call.m, call.k, call.n) < 1:
            return f"sizes must be positive: m={call.m} k={call.k} n={call.n}"
        odd = [f"{name}={getattr(call, name)}" for name in split_sizes(call.op) if getattr(call, name) % self.tp]
        if odd:
            return f"{call.op} splits {' and '.join(odd)} over tp={self.tp}"
        if self.exact and not exact_limit_ok(self._problem(call)):
            return f"exact data of {call.dtype} is not exact over k={call.k}"
        return ""

    def invalid(self) -> str:
        if not self.calls or self.tp < 1 or self.replicas < 1 or self.runs < 1:
            return "a spec needs a call, tp, replicas and runs of at least 1"
        if self.strides not in OPERAND_STRIDES or self.layout not in GROUP_LAYOUTS or self.tiling not in TILINGS:
            return (f"strides, layout and tiling must be among {OPERAND_STRIDES}, {GROUP_LAYOUTS} and {TILINGS}: "
                    f"{self.strides!r}, {self.layout!r}, {self.tiling!r}")
        if self.deterministic and not set(self.ops) <= set(DETERMINISTIC_OPS):
            return f"deterministic=True is a mode of {DETERMINISTIC_OPS} only, not of {self.ops}"
        cannot = nothing_to_compare(runs=self.runs, exact=self.exact) if self.deterministic else ""
        if cannot:
            return f"a deterministic case must be able to fail: {cannot}"
        problem = self.tiling_problem() or next(filter(None, map(self.problem, self.calls)), "")
        cannot = self.cannot_fail() if not problem else ""
        return problem or (f"a deterministic case must be able to fail: {cannot}" if cannot else "")

    def tiling_problem(self) -> str:
        """Why the explicit tiling does not fit the calls ("" when it does, or there is none)."""
        if self.tiling == "own":
            return ""
        if len({self._rows(c) for c in self.calls}) > 1:
            return "an explicit tiling needs every call to have the same rows per rank"
        try:
            tiling_blocks(self.tiling, self._rows(self.calls[0]))
        except SpecError as exc:
            return str(exc)
        return ""

    def cannot_fail(self) -> str:
        """Why a deterministic spec whose calls can run could not fail, by the fixed suite's rule ("" when it can,
        or it is not deterministic)."""
        return _cannot_fail(self) if self.deterministic else ""

    def _rows(self, call: Call) -> int:
        return rows_per_rank(call.op, call.m, self.tp)

    def _problem(self, call: Call) -> Problem:
        return Problem(call.m, call.k, call.n, call.dtype, call.bias, seed=call.seed, exact=self.exact,
                       spread=self.deterministic)

    def jobs(self) -> tuple[OpRun, ...]:
        """The suite's jobs for this spec: one run per stretch of calls of one op (what ``op_sequence_task`` runs)."""
        require_runnable(self)
        return self.jobs_unchecked()

    def jobs_unchecked(self) -> tuple[OpRun, ...]:
        """:meth:`jobs` of a spec whose calls can run (what :meth:`invalid` judges a deterministic spec by)."""
        runs: list[list[Call]] = []
        for call in self.calls:
            if runs and runs[-1][0].op == call.op:
                runs[-1].append(call)
            else:
                runs.append([call])
        tilings: tuple[tuple[int, ...] | None, ...] = (None,)
        if self.tiling != "own":
            tilings = (None, tiling_blocks(self.tiling, self._rows(self.calls[0])))
        return tuple(OpRun(calls[0].op, tuple(map(self._problem, calls)), self.tp, layout=self.layout,
                           strides=self.strides, transpose_weight=self.transpose_weight,
                           deterministic=self.deterministic, tilings=tilings,
                           runs=self.runs, straggler_s=self.straggler_s)
                     for calls in runs)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND_NAME, **asdict(self)}

    def describe(self) -> str:
        calls = ", ".join(f"{c.op if len(self.ops) > 1 else ''}{' ' if len(self.ops) > 1 else ''}"
                          f"{c.m}x{c.k}x{c.n} {c.dtype}{' +bias' if c.bias else ''}" for c in self.calls)
        modes = [f"world {self.world} {self.layout}" if self.replicas > 1 else "",
                 "weight [n, k]" if self.transpose_weight else "",
                 f"{self.strides} operands" if self.strides != "contiguous" else "",
                 "deterministic" if self.deterministic else "", "exact data" if self.exact else "",
                 f"tiling {self.tiling}" if self.tiling != "own" else "",
                 f"runs {self.runs}" if self.runs > 1 else "",
                 f"stragglers {self.straggler_s}s" if self.straggler_s else ""]
        head = self.ops[0] if len(self.ops) == 1 else "sequence"
        return f"{head} tp{self.tp} [{calls}]" + "".join(f", {m}" for m in modes if m)


@functools.lru_cache(maxsize=4096)
def _cannot_fail(spec: OpSpec) -> str:
    """The fixed suite's rule (:func:`~conformance.judge.determinism.cannot_fail`) for each of ``spec``'s jobs, once
    per spec: it multiplies the data to see whether a reordered sum shows, and a spec is asked again and again."""
    return next(filter(None, map(cannot_fail, spec.jobs_unchecked())), "")
