"""No legal spec of any kind makes the explorer raise: draws, and where neighbours and mutations lead from them.

The explorer reaches far past what it draws: a neighbour or a mutation (one field of a fresh draw) of a corpus
case or of an earlier mutation can hold any combination the kinds' rules allow (a w8A16 case of 76 groups a rank,
where the draws stop at 25).  Hypothesis drives the walk -- each step's choices come from its ``random`` -- so a
failure shrinks to the shortest walk; every spec on it is put through all the explorer does with a spec outside
the ranks: its tags (each one a bucket its kind names), its description, modes and subject, its JSON and back
(a replay), the suite's job it maps to, and its mutations (its neighbours, or a field of a fresh draw), one of
which the walk goes on to.  In process, no ranks.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.explore.explorer import mutations
from conformance.explore.kind import Kind, Scope
from conformance.explore.registry import KINDS, kind_of, spec_from_dict
from conformance.protocol import declarations

#: Walks per kind, and steps a walk takes (a step: one mutation of the spec before it, as the explorer mutates:
#: its neighbours -- every one of them built, tagged by the next step only if picked -- or a field of a new draw).
WALKS = 40
STEPS = 20


@pytest.fixture(scope="module")
def scope() -> Scope:
    from coc_impl.reference import ReferenceCoC

    impl = ReferenceCoC()
    return Scope.of(impl, declarations(impl))


def _job(spec: Any) -> Any:
    """The suite's job a spec maps to (the configuration kind's ``configure`` arguments)."""
    for build in ("jobs", "job", "run"):
        if hasattr(spec, build):
            return getattr(spec, build)()
    return spec.argv(), spec.kwargs()


def _holds(kind: Kind, spec: Any, named: set[str]) -> None:
    """Everything the explorer does with ``spec`` outside the ranks works, and says what it should."""
    assert spec.invalid() == "" and kind_of(spec) is kind, spec
    unknown = set(kind.tags(spec)) - named
    assert not unknown, f"{spec}: tags its kind names no bucket for: {unknown}"
    assert spec.describe() and kind.modes(spec) and isinstance(kind.subject(spec), str)
    assert spec_from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
    assert _job(spec) is not None


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_no_spec_a_draw_neighbour_or_mutation_reaches_makes_the_explorer_raise(kind: Kind, scope: Scope) -> None:
    named = {f"{name}={bucket}" for name, buckets in kind.buckets().items() for bucket in buckets}
    visited: list[int] = []

    @settings(max_examples=WALKS, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.randoms(use_true_random=False))
    def walk(rng: random.Random) -> None:
        spec = kind.draw(rng, scope)
        for _ in range(STEPS):
            _holds(kind, spec, named)
            visited.append(1)
            steps = mutations(spec, rng, scope)
            if steps:
                spec = rng.choice(steps)

    walk()
    assert len(visited) >= WALKS * STEPS // 2, len(visited)
