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

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import fields, replace

from conformance.explore.exploration import Exploration
from conformance.explore.finding import Finding
from conformance.explore.kind import FailureKey, Judged, Kind, Ranks, Scope
from conformance.explore.registry import KINDS, kind_of
from conformance.explore.shrink import shrink
from conformance.explore.spec import Spec
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
