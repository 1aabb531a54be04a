"""The exploration loop: draw a case, run it on the warm pool, judge it with the suite's checks, shrink failures.

A failure is identified by its kind of case and what failed -- the check's
name, its level, the failure's category and what of the case it is about
(the op, the setting, the argument, the layer) -- never by its message
(sizes differ from case to case); a crash of the layers is not hidden by a
crash of the ops found first, nor one op's wrong numbers by another's.  The
first case that fails a new way is shrunk, within a share of the time
budget, to a case that fails the same way and whose every one-step-simpler
neighbour ran and recorded no failure (else it is minimal *within reach*, and
says why); later cases failing only in known ways are counted, not shrunk
again.  A hang or a crash is a failure too (check
:data:`~conformance.explore.kind.FINISHED`), and after ``storm`` of them in a row a capability (an op,
the layers) is no longer drawn; a case not judged neither counts towards
that nor resets it.  A mode the implementation raises ``NotImplementedError``
for is not offered: it is reported so, and no longer drawn.

Each case is of one kind (``conformance/explore/registry.py``): the kind is drawn
by weight among those the implementation offers, then the case; its kind
judges it and names its simpler neighbours.

Given a corpus (``conformance/explore/corpus.py``), an exploration replays
it first, then mutates its cases now and then besides drawing fresh ones.

Everything is seeded: the same seed draws the same cases in the same order.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from conformance.explore.kind import FailureKey, Judged, Kind, Ranks, Scope
from conformance.explore.registry import KINDS, kind_of
from conformance.explore.shrink import shrink
from conformance.explore.spec import SPEC_SCHEMA, Spec, spec_key
from conformance.harness.runner import CaseTimings
from conformance.record.levels import Level
from conformance.record.verdicts import Verdicts

#: Share of the budget that shrinking may use, over all failures.
SHRINK_SHARE = 0.5
#: Cases the warm-up may take to reach one on ranks (cases in the test process come before it at no cost).
WARM_UP_DRAWS = 20
#: Draws in a row that may land on a capability the storm breaker stopped, or out of the run's reach
#: (``Scope.outside``), before the exploration ends.
STORMED_DRAWS = 50
#: Share of the cases, once the corpus has been replayed, that mutate a corpus case instead of drawing afresh.
MUTATION_SHARE = 0.25

@dataclass
class Finding:
    """A minimal failing case and how it was found."""

    key: FailureKey
    spec: Spec
    message: str
    minimal: bool
    found_after_s: float
    cases_before: int
    first_spec: Spec
    shrink_steps: int = 0
    shrink_tried: int = 0
    shrink_s: float = 0.0
    path: str = ""
    command: str = ""
    unproved: tuple[str, ...] = ()  #: why some neighbour of the case proves nothing (minimal within reach)
    cut_short: bool = False  #: shrinking's share of the budget ran out

    @property
    def proof(self) -> str:
        """What is proved of the case: minimal, minimal within reach (and why), or shrinking cut short."""
        if self.cut_short:
            return "shrinking cut short by the time budget, not proved minimal"
        if self.unproved:
            reasons = sorted(set(self.unproved))
            return (f"minimal within reach: {len(self.unproved)} simpler neighbour(s) proved nothing ("
                    + "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "") + ")")
        return "minimal"

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.key.check, "name": self.key.name, "subject": self.key.subject,
                "level": self.key.level.value, "category": self.key.category, "proof": self.proof,
                "unproved": list(self.unproved),
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
    judged_cases: int = 0  #: cases that recorded a passed or failed check (not every case skipped)
    #: Every check judged (passed or failed), as (kind, "subject: check", level), and how many cases judged it.
    judged_checks: Counter[tuple[str, str, Level]] = field(default_factory=Counter)
    shrink_cases: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    per_dimension: Counter[str] = field(default_factory=Counter)
    failing_cases: Counter[str] = field(default_factory=Counter)
    stormed: list[str] = field(default_factory=list)  #: capabilities the storm breaker stopped drawing
    outside: Counter[str] = field(default_factory=Counter)  #: draws set aside as out of reach, by why
    #: kinds the implementation offers no case of, and modes it raised ``NotImplementedError`` for: why
    not_offered: dict[str, str] = field(default_factory=dict)
    from_corpus: int = 0  #: cases replayed from the corpus (first)
    mutations: int = 0  #: cases mutated from a corpus case (or from an earlier mutation)
    per_kind: Counter[str] = field(default_factory=Counter)
    kind_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    findings: list[Finding] = field(default_factory=list)
    wall_s: float = 0.0
    warm_up_s: float = 0.0  #: the first cases, up to one on ranks, which starts their processes (off the clock)
    #: The warm-up cases by kind (counted as cases; their time is no rate's)
    warm_up: Counter[str] = field(default_factory=Counter)
    explore_s: float = 0.0  #: judging drawn cases after the warm-up
    shrink_s: float = 0.0
    judging_s: float = 0.0
    timings: CaseTimings = field(default_factory=CaseTimings)

    @property
    def cases_per_s(self) -> float:
        """Cases drawn per second of exploring (shrinking and the warm-up case not counted)."""
        return (self.cases - 1) / self.explore_s if self.explore_s > 0 else 0.0

    def kind_rate(self, name: str) -> float:
        """Cases of kind ``name`` per second of exploring (the warm-up case not counted)."""
        count = self.per_kind[name] - self.warm_up[name]
        return count / self.kind_s[name] if self.kind_s[name] > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        t = self.timings
        ranks = t.lease_wait + t.ranks
        return {
            "seed": self.seed, "budget_s": self.budget_s, "cases": self.cases, "judged_cases": self.judged_cases,
            "judged_checks": {f"{kind}: {name} [{level.value}]": count
                              for (kind, name, level), count in sorted(self.judged_checks.items())},
            "shrink_cases": self.shrink_cases,
            "cases_per_s": round(self.cases_per_s, 2), "skipped": dict(self.skipped),
            "warm_up_cases": dict(self.warm_up),
            "per_kind": {name: {"cases": count, "seconds": round(self.kind_s[name], 2),
                                "cases_per_s": round(self.kind_rate(name), 2)}
                         for name, count in sorted(self.per_kind.items())},
            "not_offered": self.not_offered, "from_corpus": self.from_corpus, "mutations": self.mutations,
            "per_dimension": dict(sorted(self.per_dimension.items())), "failing_cases": dict(self.failing_cases),
            "stormed": self.stormed, "outside": dict(self.outside),
            "time_s": {"wall": round(self.wall_s, 2), "warm_up": round(self.warm_up_s, 2),
                       "exploring": round(self.explore_s, 2),
                       "shrinking": round(self.shrink_s, 2), "ranks": round(ranks, 2),
                       "implementation": round(t.impl, 2), "references": round(t.reference, 2),
                       "pool_start": round(t.pool_start, 2), "lease_wait": round(t.lease_wait, 2),
                       "judging": round(self.judging_s, 2),
                       "overhead": round(max(0.0, self.wall_s - ranks - self.judging_s), 2)},
            "findings": [f.as_dict() for f in self.findings],
        }


def mutations(start: Spec, rng: random.Random, scope: Scope) -> list[Spec]:
    """The cases one mutation of ``start`` picks from: half the time its one-step-simpler neighbours (the shrinker's
    steps), else ``start`` with one field taken from a fresh draw of its kind -- each a valid spec other than
    ``start`` (a field that names no runnable case with the others is dropped)."""
    kind = kind_of(start)
    if rng.random() < 0.5:
        steps = list(kind.neighbours(start))
    else:
        drawn = kind.draw(rng, scope)
        name = rng.choice([f.name for f in fields(drawn)])  # type: ignore[arg-type]
        steps = [replace(start, **{name: getattr(drawn, name)})]  # type: ignore[type-var]
    return [n for n in steps if n != start and not n.invalid()]


class Explorer:
    """Explores what ``scope`` offers of one implementation on ``ranks`` for ``budget_s`` seconds from ``seed``."""

    def __init__(self, ranks: Ranks, *, seed: int, budget_s: float, scope: Scope, storm: int = 3,
                 kinds: Sequence[Kind] = KINDS, clock: Callable[[], float] = time.monotonic,
                 corpus: Sequence[Spec] = ()) -> None:
        self.ranks = ranks
        self.scope = scope
        self.kinds = [k for k in kinds if not k.offered(scope)]
        self.storm = storm
        self.clock = clock
        self.report = Exploration(seed, budget_s, timings=ranks.timings)
        self.report.not_offered = {k.name: k.offered(scope) for k in kinds if k.offered(scope)}
        self.rng = random.Random(seed)
        self.hangs_in_a_row: Counter[str] = Counter()
        self.unoffered: dict[frozenset[str], str] = {}  #: modes raising ``NotImplementedError``, and why
        #: The corpus cases of offered kinds not replayed yet, and the cases mutations start from.
        self.unreplayed = [spec for spec in corpus if kind_of(spec).name in {k.name for k in self.kinds}]
        self.mutable = list(self.unreplayed)

    def judge(self, spec: Spec) -> Judged:
        """The case judged by its kind (each failure keyed on what it is about), its judging time and its hangs
        counted; a case not judged leaves the count of hangs in a row as it was."""
        timings = self.ranks.timings
        kind = kind_of(spec)
        start, on_ranks = self.clock(), timings.lease_wait + timings.ranks
        judged = kind.judge(self.ranks, spec, self.scope, Verdicts())
        self.report.judging_s += self.clock() - start - (timings.lease_wait + timings.ranks - on_ranks)
        subject = kind.subject(spec)
        judged = replace(judged, failures=tuple((k.about(subject), m) for k, m in judged.failures),
                         judged=tuple(k.about(subject) for k in judged.judged))
        hung = any(k.category == "hang" for k, _ in judged.failures)
        if hung:
            self.hangs_in_a_row[spec.capability] += 1
        elif judged.failures or judged.judged:
            self.hangs_in_a_row[spec.capability] = 0
        if judged.not_offered and judged.not_offered not in self.unoffered:
            self.unoffered[judged.not_offered] = judged.skipped
            self.report.not_offered[f"{kind.name}: {', '.join(sorted(judged.not_offered))}"] = judged.skipped
        return judged

    def not_offered(self, spec: Spec) -> str:
        """Why ``spec`` needs a mode the implementation raised ``NotImplementedError`` for ("" when it does not)."""
        modes = kind_of(spec).modes(spec)
        found = next((key for key in self.unoffered if key <= modes), None)
        return "" if found is None else f"not offered: {', '.join(sorted(found))}"

    def draw(self) -> Spec | None:
        """The next case: a kind by weight, then a case of it; None once every draw lands on a stormed capability
        or out of reach (more ranks than the node hosts, a TP size ``--coc-tp`` leaves out: counted, not run)."""
        for _ in range(STORMED_DRAWS):
            kind = self.rng.choices(self.kinds, [k.weight for k in self.kinds])[0]
            spec = kind.draw(self.rng, self.scope)
            why = self.scope.outside(spec) or self.not_offered(spec)
            if why:
                self.report.outside[why] += 1
            elif spec.capability not in self.report.stormed:
                return spec
        return None

    def next_case(self) -> Spec | None:
        """The corpus's cases first (those within reach), then now and then a mutation, else a fresh draw."""
        while self.unreplayed:
            spec = self.unreplayed.pop(0)
            why = self.scope.outside(spec) or self.not_offered(spec)
            if why:
                self.report.outside[why] += 1
            elif spec.capability not in self.report.stormed:
                self.report.from_corpus += 1
                return spec
        mutated = self.mutation() if self.mutable and self.rng.random() < MUTATION_SHARE else None
        return mutated or self.draw()

    def mutation(self) -> Spec | None:
        """A mutation of a corpus case or of an earlier mutation, within reach: half the time one of its one-step
        simpler neighbours (the shrinker's steps), else the case with one field taken from a fresh draw of its
        kind (a spec it names no runnable case with is dropped); None when neither gives a new case."""
        start = self.rng.choice(self.mutable)
        steps = [n for n in mutations(start, self.rng, self.scope) if not self.scope.outside(n)
                 and not self.not_offered(n) and n.capability not in self.report.stormed]
        if not steps:
            return None
        spec = self.rng.choice(steps)
        self.mutable.append(spec)
        self.report.mutations += 1
        return spec

    def explore(self) -> Exploration:
        """Draw, run and judge cases until the budget is spent; shrink each new way of failing."""
        report = self.report
        began = self.clock()
        known: set[tuple[str, FailureKey]] = set()
        spec = self.next_case() if self.kinds else None
        for _ in range(WARM_UP_DRAWS):  # up to the first case on ranks, which starts their processes: off the clock
            if spec is None:
                break
            self._explored(spec, began, known)
            report.warm_up[kind_of(spec).name] += 1
            on_ranks = bool(spec.world)
            spec = self.next_case()
            if on_ranks:
                break
        start = self.clock()
        report.warm_up_s, report.explore_s = start - began, 0.0
        report.kind_s.clear()
        deadline = start + report.budget_s
        while spec is not None and self.clock() < deadline:  # the case drawn last is judged before the next draw
            self._explored(spec, start, known)
            spec = self.next_case() if self.clock() < deadline else None
        report.wall_s = self.clock() - began
        return report

    def _explored(self, spec: Spec, start: float, known: set[tuple[str, FailureKey]]) -> None:
        """Judge ``spec``, count it, and shrink each way it fails that is not ``known`` yet (for its kind)."""
        report = self.report
        kind = kind_of(spec)
        began = self.clock()
        judged = self.judge(spec)
        took = self.clock() - began
        report.explore_s += took
        report.cases += 1
        report.per_kind[kind.name] += 1
        report.kind_s[kind.name] += took
        report.per_dimension.update(f"{kind.name}.{tag}" for tag in kind.tags(spec))
        if judged.skipped:
            report.skipped[judged.skipped] += 1
        if judged.judged:
            report.judged_cases += 1
            report.judged_checks.update({(kind.name, k.name, k.level) for k in judged.judged})
        report.failing_cases.update(f"{kind.name}: {k.name}" for k, _ in judged.failures)
        for key, message in judged.failures:
            if (kind.name, key) not in known:
                known.add((kind.name, key))
                left = report.budget_s * SHRINK_SHARE - report.shrink_s
                finding = self._shrunk(key, spec, message, self.clock() - start, left)
                if (kind.name, finding.key) not in {(kind_of(f.spec).name, f.key) for f in report.findings}:
                    report.findings.append(finding)  # else it shrank to a case failing as one found before
                known.add((kind.name, finding.key))
        self._break_storms()

    def _shrunk(self, key: FailureKey, spec: Spec, message: str, after: float, budget: float) -> Finding:
        """``spec`` shrunk to a simplest case failing the same way (``key.way``: on any subject, so a sequence may
        shrink to one op), and what is proved of it."""
        began = self.clock()
        found_as = {spec: (key, message)}

        def fails(candidate: Spec) -> bool | str:
            why = self.scope.outside(candidate) or self.not_offered(candidate)
            if why:
                return why
            self.report.shrink_cases += 1
            judged = self.judge(candidate)
            same = [(k, m) for k, m in judged.failures if k.way == key.way]
            if same:
                found_as[candidate] = same[0]
                return True
            if judged.failures:
                return f"{candidate.describe()} failed another way ({judged.failures[0][0].name})"
            if not judged.judged:
                return f"{candidate.describe()} was not judged ({judged.skipped or 'no check recorded'})"
            return False

        result = shrink(spec, fails, lambda case: kind_of(case).neighbours(case), began + max(0.0, budget),
                        self.clock)
        took = self.clock() - began
        self.report.shrink_s += took
        final_key, final_message = found_as[result.case]
        return Finding(final_key, result.case, final_message, result.minimal, after, self.report.cases, spec,
                       result.steps, result.tried, took, unproved=result.unproved, cut_short=result.cut_short)

    def _break_storms(self) -> None:
        for capability, count in self.hangs_in_a_row.items():
            if self.storm and count >= self.storm and capability not in self.report.stormed:
                self.report.stormed.append(capability)


def write_finding(finding: Finding, directory: Path, command: Callable[[Path], str], report: Exploration) -> Path:
    """Save ``finding`` as a replayable spec file (with the command that replays it); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{finding.key.slug()}-{spec_key(finding.spec)}.json"
    finding.path, finding.command = str(path), command(path)
    doc = {"schema": SPEC_SCHEMA, **finding.as_dict(), "seed": report.seed, "budget_s": report.budget_s}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path
