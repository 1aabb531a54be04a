"""The explorer's parts without ranks: specs as JSON, seeded draws, the space's lines, the shrinker."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import fields, replace
from pathlib import Path

import pytest

from conformance.cases.groups import GROUP_LAYOUTS
from conformance.contract.jobs import OPERAND_STRIDES
from conformance.explore import op_calls as ops
from conformance.explore import space as dimensions
from conformance.explore.finding import load_finding
from conformance.explore.op_spec import Call, OpSpec
from conformance.explore.registry import spec_from_dict
from conformance.explore.shrink import shrink
from conformance.explore.spec import SpecError


def _drawn(seed: int, count: int = 200) -> list[OpSpec]:
    rng = random.Random(seed)
    return [ops.draw(rng) for _ in range(count)]


def test_every_drawn_spec_is_valid_and_round_trips_through_json() -> None:
    for spec in _drawn(7):
        assert spec.invalid() == "", spec
        assert spec_from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
        assert spec.jobs()[0].problems[0].m == spec.calls[0].m


def test_a_call_coinciding_with_a_thin_reduce_scatter_still_has_rows() -> None:
    """A call sized to the last call's output before that call is fitted: a reduce-scatter of fewer rows than
    ranks leaves it no row, and the draw must still be valid."""
    thin = Call(m=1, k=8, n=4, dtype="float32", bias=False, seed=1, op="matmul_reduce_scatter")
    after = ops.coinciding(replace(thin, op="matmul_all_reduce"), thin, tp=2)
    assert after.m >= 1
    assert ops.fit(OpSpec(calls=(thin, after), tp=2, replicas=1, layout=GROUP_LAYOUTS[0], transpose_weight=False,
                          strides="contiguous", deterministic=False, exact=False, tiling="own", runs=1,
                          straggler_s=0.0), up=True).invalid() == ""


def test_the_same_seed_draws_the_same_cases_and_another_seed_others() -> None:
    assert _drawn(1) == _drawn(1)
    assert _drawn(1) != _drawn(2)


def test_every_field_of_a_spec_and_a_call_is_one_line_of_the_space() -> None:
    assert {d.name for d in ops.SPEC_DIMENSIONS} | {"calls"} == {f.name for f in fields(OpSpec)}
    assert {d.name for d in ops.CALL_DIMENSIONS} | {"seed"} == {f.name for f in fields(Call)}


def test_the_space_reaches_the_corners_the_fixed_suite_lacks() -> None:
    specs = _drawn(3, 2000)
    calls = [c for s in specs for c in s.calls]
    assert any(c.m > 1000 and c.m % 2 for c in calls), "long odd token counts"
    assert any(c.n % 8 for c in calls) and any(c.k % 4 for c in calls), "unaligned n and k"
    assert {s.tp for s in specs} == {1, 2, 3, 4}
    assert any(s.replicas > 1 and s.layout == "strided" for s in specs)
    assert any(len(s.calls) >= 3 and len({(c.m, c.k, c.n, c.dtype) for c in s.calls[:3]}) == 1 for s in specs)
    assert {s.strides for s in specs} == set(OPERAND_STRIDES), "strided operands"
    assert any(len(s.ops) > 1 for s in specs), "sequences mixing ops"
    assert any(s.tiling != "own" and s.exact for s in specs), "explicit tilings of exact data"
    assert any(s.deterministic and s.tiling != "own" and s.runs > 1 for s in specs), "deterministic tilings"


@pytest.mark.parametrize("data, why", [
    ({"kind": "nope"}, "unknown spec kind"),
    ({"kind": "op", "tp": 2}, "malformed"),
    ({"kind": "op", "tp": 2, "calls": [{"m": 4, "k": 4, "n": 4, "op": "nope"}]}, "unknown op"),
    ({"kind": "op", "tp": 2, "calls": [{"m": 3, "k": 4, "n": 4, "op": "matmul_reduce_scatter"}]}, r"m=3 over tp=2"),
    ({"kind": "op", "tp": 2, "deterministic": True, "calls": [{"m": 4, "k": 4, "n": 4, "op": "all_gather_matmul"}]},
     "deterministic=True is a mode of"),
    ({"kind": "op", "tp": 1, "tiling": "halves", "calls": [{"m": 4, "k": 4, "n": 4},
                                                           {"m": 2, "k": 4, "n": 4}]}, "explicit tiling"),
    # a deterministic spec that could not fail: replaying such a file says so, and judges nothing
    ({"kind": "op", "tp": 3, "deterministic": True, "calls": [{"m": 4, "k": 6, "n": 4}]},
     "must be able to fail: one run per tiling"),
    ({"kind": "op", "tp": 3, "deterministic": True, "exact": True, "runs": 2, "calls": [{"m": 4, "k": 6, "n": 4}]},
     "must be able to fail: exact data"),
    # the fixed suite's rule (cannot_fail): a TP sum of one or two ranks is the same in any order (issue 50)
    ({"kind": "op", "tp": 2, "deterministic": True, "runs": 2, "calls": [{"m": 64, "k": 96, "n": 64}]},
     "must be able to fail: .*the same bits for the TP sum in any order"),
    ({"kind": "op", "tp": 1, "deterministic": True, "runs": 2, "calls": [{"m": 64, "k": 96, "n": 64}]},
     "must be able to fail: .*the same bits for the TP sum in any order"),
    ({"kind": "op", "tp": 1, "strides": "diagonal", "calls": [{"m": 4, "k": 4, "n": 4}]}, "strides"),
])
def test_a_spec_that_names_no_runnable_case_is_refused_saying_why(data: dict[str, object], why: str) -> None:
    with pytest.raises(SpecError, match=why):
        spec_from_dict(data)


def test_a_file_that_is_not_a_finding_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"schema": 99}')
    with pytest.raises(SpecError, match="not a spec of schema"):
        load_finding(path)


def _long_odd(spec: OpSpec) -> bool:
    """A synthetic fault: wrong when some call has more than 1000 rows, an odd number of them, with a bias."""
    return any(c.m > 1000 and c.m % 2 and c.bias for c in spec.calls)


def test_shrinking_keeps_the_failure_and_ends_where_every_simpler_neighbour_passes() -> None:
    agm = "all_gather_matmul"
    start = OpSpec((Call(90, 33, 17, "bfloat16", True, 5, agm), Call(2379, 301, 77, "float16", True, 6, agm),
                    Call(2379, 301, 77, "float16", True, 9, "matmul_all_reduce")), tp=3, replicas=1,
                   transpose_weight=True, strides="sliced", deterministic=False, runs=2, straggler_s=0.002)
    assert _long_odd(start)
    result = shrink(start, _long_odd, ops.neighbours, deadline=float("inf"))
    assert result.minimal and _long_odd(result.case)
    assert result.case == OpSpec((Call(1001, 1, 1, "float32", True, 9, "matmul_all_reduce"),), tp=1)
    neighbours = list(ops.neighbours(result.case))
    assert neighbours and not any(map(_long_odd, neighbours))


def test_shrinking_judges_each_case_once_and_stops_at_its_deadline() -> None:
    judged: list[OpSpec] = []
    ticks = itertools.count()

    def fails(spec: OpSpec) -> bool:
        judged.append(spec)
        return _long_odd(spec)

    start = OpSpec((Call(2001, 64, 64),) * 3, tp=2)
    result = shrink(start, fails, ops.neighbours, deadline=5, clock=lambda: float(next(ticks)))
    assert not result.minimal and result.tried == len(judged) == len(set(judged)) <= 5
    assert _long_odd(result.case)


def test_neighbours_are_valid_simpler_and_never_the_case_itself() -> None:
    for spec in _drawn(11, 50):
        for n in ops.neighbours(spec):
            assert n != spec and n.invalid() == ""
            assert len(n.calls) <= len(spec.calls) and n.tp <= spec.tp and n.replicas <= spec.replicas


def test_smaller_sizes_include_one_and_both_parities() -> None:
    assert dimensions.smaller_ints(1) == []
    found = dimensions.smaller_ints(2377)
    assert found[0] == 1 and max(found) == 2376 and {v % 2 for v in found} == {0, 1}


def test_a_repeated_shape_shrinks_as_a_whole() -> None:
    """Three calls of one shape (a double-buffer fault): the shared sizes shrink together, to 1."""
    def third_of_a_shape(spec: OpSpec) -> bool:
        shapes = [(c.m, c.k, c.n) for c in spec.calls]
        return any(len(set(shapes[i:i + 3])) == 1 for i in range(len(shapes) - 2))

    start = OpSpec((Call(36, 8, 47, "bfloat16", False, 1, "matmul_reduce_scatter"),) * 3, tp=4)
    result = shrink(start, third_of_a_shape, ops.neighbours, deadline=float("inf"))
    assert result.minimal and [(c.m, c.k, c.n) for c in result.case.calls] == [(1, 1, 1)] * 3


def test_every_explorer_only_fault_is_a_faulty_implementation() -> None:
    from tests.support import faulty_impls
    from tests.support.explorer_faults import EXPLORER_FAULTS

    for row in EXPLORER_FAULTS:
        assert callable(getattr(faulty_impls, row.fault, None)), row.fault
        assert row.check, row


def test_no_deterministic_draw_neighbour_or_mutation_is_a_case_that_cannot_fail() -> None:
    """Every deterministic spec the explorer builds compares something that could differ: two runs of each tiling
    or more, never exact data, spread data (issue 43: mutations built one run, one tiling, no exact data), at TP 3
    or more, by the fixed suite's own rule (issue 50: TP 1 and 2 specs recorded passes)."""
    from coc_impl.reference import ReferenceCoC
    from conformance.explore.explorer import mutations
    from conformance.explore.kind import Scope
    from conformance.judge.determinism import cannot_fail, nothing_to_compare
    from conformance.protocol import declarations

    scope = Scope.of(ReferenceCoC(), declarations(ReferenceCoC()))
    rng = random.Random(5)
    specs = [s for s in _drawn(5, 3000) if s.deterministic]
    assert len(specs) > 100
    built = specs + [n for s in specs[:60] for n in [*ops.neighbours(s), *mutations(s, rng, scope)]]
    deterministic = [s for s in built if s.deterministic]
    assert len(deterministic) > len(specs)
    for spec in deterministic:
        assert nothing_to_compare(runs=spec.runs, exact=spec.exact) == "", spec.describe()
        assert all(p.spread and not p.exact for run in spec.jobs() for p in run.problems), spec.describe()
        assert spec.tp >= 3 and all(cannot_fail(run) == "" for run in spec.jobs()), spec.describe()
    one_run = replace(specs[0], runs=1)
    assert "one run per tiling" in one_run.invalid() and one_run not in built


def test_a_case_is_minimal_only_when_every_neighbour_ran_and_recorded_no_failure() -> None:
    """A neighbour not judged, failing another way or out of reach proves nothing: minimal within reach, why."""
    start = OpSpec((Call(1001, 1, 1, "float32", True, 9, "matmul_all_reduce"),), tp=1)
    unreachable = {n: "out of reach: TP 1 is not among --coc-tp 2" for n in ops.neighbours(start)
                         if not n.calls[0].bias}

    def fails(spec: OpSpec) -> bool | str:
        return _long_odd(spec) or unreachable.get(spec, False)

    result = shrink(start, fails, ops.neighbours, deadline=float("inf"))
    assert unreachable and result.case == start
    assert not result.minimal and not result.cut_short
    assert set(result.unproved) == {"out of reach: TP 1 is not among --coc-tp 2"}
