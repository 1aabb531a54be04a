"""The exploration loop: draw a case, run it on the warm pool, judge it with the suite's checks, shrink failures.

A failure is identified by what failed -- the check's name, its level and
the failure's category -- never by its message (sizes differ from case to
case).  The first case that fails a new way is shrunk, within a share of the
time budget, to a case that fails the same way and whose every
one-step-simpler neighbour passes; later cases failing only in known ways are
counted, not shrunk again.  A hang or a crash is a failure too (check
:data:`FINISHED`), and after ``storm`` of them in a row an op is no longer drawn.

Everything is seeded: the same seed draws the same cases in the same order.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conformance.cases.op_cases import op_task
from conformance.explore import space
from conformance.explore.shrink import shrink
from conformance.explore.spec import SPEC_SCHEMA, OpSpec
from conformance.harness.case_errors import HANGS, CaseError
from conformance.harness.runner import CaseTimings
from conformance.judge import ops as judge
from conformance.judge.checks import not_implemented
from conformance.judge.failures import CheckFailure
from conformance.judge.levels import Level
from conformance.judge.op_verdicts import judge_op_runs
from conformance.judge.verdicts import Verdicts

#: The check a case fails when it does not finish on every rank (hang, crash, unexpected rank error).
FINISHED = "the case finished on every rank"
#: Share of the budget that shrinking may use, over all failures.
SHRINK_SHARE = 0.5


class Ranks(Protocol):
    """What the explorer needs of :class:`~conformance.harness.runner.CaseRanks`."""

    timings: CaseTimings

    def run(self, fn: Any, world_size: int, **params: Any) -> list[Any]: ...


@dataclass(frozen=True)
class FailureKey:
    """What failed: the check, its level, the failure's category."""

    check: str
    level: Level
    category: str

    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.check.lower()).strip("-")


@dataclass(frozen=True)
class Judged:
    """One case's verdict: each failed check's key and message ("skipped" says why nothing was judged)."""

    failures: tuple[tuple[FailureKey, str], ...] = ()
    skipped: str = ""



@dataclass
class Finding:
    """A minimal failing case and how it was found."""

    key: FailureKey
    spec: OpSpec
    message: str
    minimal: bool
    found_after_s: float
    cases_before: int
    first_spec: OpSpec
    shrink_steps: int = 0
    shrink_tried: int = 0
    shrink_s: float = 0.0
    path: str = ""
    command: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.key.check, "level": self.key.level.value, "category": self.key.category,
                "message": self.message, "minimal": self.minimal, "spec": self.spec.as_dict(),
                "case": self.spec.describe(), "first_failing_case": self.first_spec.describe(),
                "found_after_s": round(self.found_after_s, 2), "cases_before": self.cases_before,
                "shrink_steps": self.shrink_steps, "shrink_cases": self.shrink_tried,
                "shrink_s": round(self.shrink_s, 2), "path": self.path, "command": self.command}


@dataclass
class Exploration:
    """What an exploration did: cases, per dimension, where the time went, findings."""

    seed: int
    budget_s: float
    cases: int = 0
    shrink_cases: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    per_dimension: Counter[str] = field(default_factory=Counter)
    failing_cases: Counter[str] = field(default_factory=Counter)
    stormed: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    wall_s: float = 0.0
    warm_up_s: float = 0.0  #: the first case, which starts the rank processes (before the budget's clock)
    explore_s: float = 0.0  #: judging drawn cases after the warm-up
    shrink_s: float = 0.0
    judging_s: float = 0.0
    timings: CaseTimings = field(default_factory=CaseTimings)

    @property
    def cases_per_s(self) -> float:
        """Cases drawn per second of exploring (shrinking and the warm-up case not counted)."""
        return (self.cases - 1) / self.explore_s if self.explore_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        t = self.timings
        ranks = t.lease_wait + t.ranks
        return {
            "seed": self.seed, "budget_s": self.budget_s, "cases": self.cases, "shrink_cases": self.shrink_cases,
            "cases_per_s": round(self.cases_per_s, 2), "skipped": dict(self.skipped),
            "per_dimension": dict(sorted(self.per_dimension.items())), "failing_cases": dict(self.failing_cases),
            "stormed_ops": self.stormed,
            "time_s": {"wall": round(self.wall_s, 2), "warm_up": round(self.warm_up_s, 2),
                       "exploring": round(self.explore_s, 2),
                       "shrinking": round(self.shrink_s, 2), "ranks": round(ranks, 2),
                       "implementation": round(t.impl, 2), "references": round(t.reference, 2),
                       "pool_start": round(t.pool_start, 2), "lease_wait": round(t.lease_wait, 2),
                       "judging": round(self.judging_s, 2),
                       "overhead": round(max(0.0, self.wall_s - ranks - self.judging_s), 2)},
            "findings": [f.as_dict() for f in self.findings],
        }


def record(verdicts: Verdicts, key: FailureKey, message: str) -> None:
    """Record into ``verdicts`` that check ``key`` failed with ``message`` (its category kept)."""
    failure = CheckFailure(message, level=key.level)
    failure.category = key.category
    with verdicts.check(key.check, key.level):
        raise failure


def judge_spec(ranks: Ranks, spec: OpSpec, in_place_ops: frozenset[str], verdicts: Verdicts) -> Judged:
    """Run ``spec`` on ``ranks`` and record the suite's checks of an op run into ``verdicts``.

    A case that does not finish on every rank fails check :data:`FINISHED`
    (category ``hang`` for hangs and crashes, ``error`` for an unexpected rank error).
    """
    run = spec.job()
    try:
        outcomes = ranks.run(op_task, spec.world, run=run)
    except CaseError as exc:
        key = FailureKey(FINISHED, Level.MUST, "hang" if isinstance(exc, HANGS) else "error")
        message = f"{spec.describe()}: {type(exc).__name__}: {exc}"
        record(verdicts, key, message)
        return Judged(((key, message),))
    skipped = not_implemented(judge.call_errors(outcomes))
    if skipped:
        return Judged(skipped=skipped)
    judge_op_runs(verdicts, [(run, outcomes)], in_place_ops)
    return Judged(tuple((FailureKey(r.name, r.level, r.category), r.message) for r in verdicts.results if r.failed))


class Explorer:
    """Explores ``ops`` of one implementation on ``ranks`` for ``budget_s`` seconds from ``seed``."""

    def __init__(self, ranks: Ranks, *, seed: int, budget_s: float, ops: Sequence[str],
                 in_place_ops: frozenset[str] = frozenset(), storm: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ranks = ranks
        self.ops = list(ops)
        self.in_place_ops = in_place_ops
        self.storm = storm
        self.clock = clock
        self.report = Exploration(seed, budget_s, timings=ranks.timings)
        self.rng = random.Random(seed)
        self.hangs_in_a_row: Counter[str] = Counter()

    def judge(self, spec: OpSpec) -> Judged:
        """:func:`judge_spec` of ``spec``, its judging time and its hangs counted."""
        timings = self.ranks.timings
        start, on_ranks = self.clock(), timings.lease_wait + timings.ranks
        judged = judge_spec(self.ranks, spec, self.in_place_ops, Verdicts())
        self.report.judging_s += self.clock() - start - (timings.lease_wait + timings.ranks - on_ranks)
        hung = any(k.category == "hang" for k, _ in judged.failures)
        self.hangs_in_a_row[spec.op] = self.hangs_in_a_row[spec.op] + 1 if hung else 0
        return judged

    def explore(self) -> Exploration:
        """Draw, run and judge cases until the budget is spent; shrink each new way of failing."""
        report = self.report
        began = self.clock()
        known: set[FailureKey] = set()
        self._explored(space.draw(self.rng, self.ops), began, known)  # starts the rank processes: not on the clock
        start = self.clock()
        report.warm_up_s, report.explore_s = start - began, 0.0
        deadline = start + report.budget_s
        while self.clock() < deadline and self.ops:
            self._explored(space.draw(self.rng, self.ops), start, known)
        report.wall_s = self.clock() - began
        return report

    def _explored(self, spec: OpSpec, start: float, known: set[FailureKey]) -> None:
        """Judge ``spec``, count it, and shrink each way it fails that is not ``known`` yet."""
        report = self.report
        began = self.clock()
        judged = self.judge(spec)
        report.explore_s += self.clock() - began
        report.cases += 1
        report.per_dimension.update(space.tags(spec))
        if judged.skipped:
            report.skipped[judged.skipped] += 1
        report.failing_cases.update(k.check for k, _ in judged.failures)
        for key, message in judged.failures:
            if key not in known:
                known.add(key)
                left = report.budget_s * SHRINK_SHARE - report.shrink_s
                report.findings.append(self._shrunk(key, spec, message, self.clock() - start, left))
        self._break_storms()

    def _shrunk(self, key: FailureKey, spec: OpSpec, message: str, after: float, budget: float) -> Finding:
        began = self.clock()
        messages = {spec: message}

        def fails(candidate: OpSpec) -> bool:
            self.report.shrink_cases += 1
            found = dict(self.judge(candidate).failures)
            if key in found:
                messages[candidate] = found[key]
            return key in found

        result = shrink(spec, fails, space.neighbours, began + max(0.0, budget), self.clock)
        took = self.clock() - began
        self.report.shrink_s += took
        return Finding(key, result.case, messages[result.case], result.minimal, after, self.report.cases, spec,
                       result.steps, result.tried, took)

    def _break_storms(self) -> None:
        for op, count in self.hangs_in_a_row.items():
            if self.storm and count >= self.storm and op in self.ops:
                self.ops.remove(op)
                self.report.stormed.append(op)


def write_finding(finding: Finding, directory: Path, command: Callable[[Path], str], report: Exploration) -> Path:
    """Save ``finding`` as a replayable spec file (with the command that replays it); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{finding.key.slug()}-{finding.spec.key()}.json"
    finding.path, finding.command = str(path), command(path)
    doc = {"schema": SPEC_SCHEMA, **finding.as_dict(), "seed": report.seed, "budget_s": report.budget_s}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path
