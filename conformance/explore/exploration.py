"""What an exploration did, as its report shows it: cases by kind and dimension, where the time went, what it found.

Counted by the explorer (``conformance/explore/explorer.py``) as it goes, and
written into the case's report properties (``EXPLORE``) by ``test_explore``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from conformance.explore.finding import Finding
from conformance.harness.runner import CaseTimings
from conformance.record.levels import Level


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
