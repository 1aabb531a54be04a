"""A case of the explorer as plain data: what it runs, which job it maps to, its JSON form.

A spec is small and frozen, so the same seed draws equal specs, a shrinker
compares them, and a minimal failing case is kept as a JSON file that
``--coc-replay`` turns back into the same job.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from conformance.contract.jobs import OpRun
from conformance.contract.problems import Problem
from conformance.protocol import FUSED_OPS

#: Version of the JSON form (a replay refuses another).
SPEC_SCHEMA = 1
#: The ops whose weight (``k``) is split over the TP ranks; the reduce-scatter also splits its rows.
K_SPLIT = ("matmul_all_reduce", "matmul_reduce_scatter")


class SpecError(ValueError):
    """A spec that names no runnable case (unknown op, sizes no TP split divides, a malformed file)."""


@dataclass(frozen=True)
class Call:
    """One call of the op: global ``X [m, k] @ W [k, n] (+ bias)``, seeded data."""

    m: int
    k: int
    n: int
    dtype: str = "float32"
    bias: bool = True
    seed: int = 0


@dataclass(frozen=True)
class OpSpec:
    """Calls of one op back to back on a TP group of ``tp`` ranks in a world of ``tp * replicas``."""

    op: str
    calls: tuple[Call, ...]
    tp: int
    replicas: int = 1
    layout: str = "contiguous"
    transpose_weight: bool = False
    runs: int = 1
    straggler_s: float = 0.0

    @property
    def world(self) -> int:
        return self.tp * self.replicas

    @property
    def split_sizes(self) -> tuple[str, ...]:
        """The sizes of a call the op splits over the TP ranks (each must be a multiple of ``tp``)."""
        return (("k",) if self.op in K_SPLIT else ()) + (("m",) if self.op != "matmul_all_reduce" else ())

    def problem(self, call: Call) -> str:
        """Why ``call`` cannot run in this spec ("" when it can)."""
        if min(call.m, call.k, call.n) < 1:
            return f"sizes must be positive: m={call.m} k={call.k} n={call.n}"
        odd = [f"{name}={getattr(call, name)}" for name in self.split_sizes if getattr(call, name) % self.tp]
        return f"{self.op} splits {' and '.join(odd)} over tp={self.tp}" if odd else ""

    def invalid(self) -> str:
        """Why this spec names no runnable case ("" when it does)."""
        if self.op not in FUSED_OPS:
            return f"unknown op {self.op!r}; known: {FUSED_OPS}"
        if not self.calls or self.tp < 1 or self.replicas < 1 or self.runs < 1:
            return "a spec needs a call, tp, replicas and runs of at least 1"
        return next(filter(None, map(self.problem, self.calls)), "")

    def job(self) -> OpRun:
        """The suite's job for this spec (what ``op_task`` runs on every rank)."""
        why = self.invalid()
        if why:
            raise SpecError(why)
        problems = tuple(Problem(c.m, c.k, c.n, c.dtype, c.bias, seed=c.seed) for c in self.calls)
        return OpRun(self.op, problems, self.tp, layout=self.layout, transpose_weight=self.transpose_weight,
                     runs=self.runs, straggler_s=self.straggler_s)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "op", **asdict(self)}

    def key(self) -> str:
        """A short stable hash of the spec (file names)."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:10]

    def describe(self) -> str:
        calls = ", ".join(f"{c.m}x{c.k}x{c.n} {c.dtype}{' +bias' if c.bias else ''}" for c in self.calls)
        modes = [f"world {self.world} {self.layout}" if self.replicas > 1 else "",
                 "weight [n, k]" if self.transpose_weight else "", f"runs {self.runs}" if self.runs > 1 else "",
                 f"stragglers {self.straggler_s}s" if self.straggler_s else ""]
        return f"{self.op} tp{self.tp} [{calls}]" + "".join(f", {m}" for m in modes if m)


def spec_from_dict(data: dict[str, Any]) -> OpSpec:
    """The spec of :meth:`OpSpec.as_dict` (``kind`` must be ``op``)."""
    try:
        fields = dict(data)
        kind = fields.pop("kind")
        if kind != "op":
            raise SpecError(f"unknown spec kind {kind!r}; known: 'op'")
        calls = tuple(Call(**c) for c in fields.pop("calls"))
        spec = OpSpec(calls=calls, **fields)
    except (KeyError, TypeError) as exc:
        raise SpecError(f"malformed spec: {exc}") from None
    why = spec.invalid()
    if why:
        raise SpecError(why)
    return spec


def load_finding(path: Path) -> tuple[OpSpec, dict[str, Any]]:
    """The spec of a finding file written by the explorer, and the whole document."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: not a spec file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SPEC_SCHEMA or "spec" not in doc:
        raise SpecError(f"{path}: not a spec of schema {SPEC_SCHEMA}")
    return spec_from_dict(doc["spec"]), doc
