"""Every kind of case the explorer draws, without ranks: valid draws, JSON round trips, seeds, the space's lines,
the corners each reaches, shrinking steps; the configuration model against the fixed tables."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from dataclasses import fields, replace
from typing import Any

import pytest

from conformance.contract.config_rules import expected_outcome
from conformance.explore import config_settings, layer_training, op_calls, quant_calls, space
from conformance.explore import explorer as explorer_module
from conformance.explore.explorer import STORMED_DRAWS, Explorer
from conformance.explore.kind import FINISHED, FailureKey, Judged, Kind, Scope
from conformance.explore.op_spec import TILINGS, Call, OpSpec
from conformance.explore.registry import KINDS, kind_of, spec_from_dict
from conformance.explore.shrink import shrink
from conformance.explore.spec import SpecError
from conformance.harness.runner import CaseTimings
from conformance.protocol import declarations
from conformance.record.levels import Level
from conformance.record.verdicts import NOT_JUDGED, Verdicts


@pytest.fixture(scope="module")
def scope() -> Scope:
    from coc_impl.reference import ReferenceCoC

    impl = ReferenceCoC()
    return Scope.of(impl, declarations(impl))


def _drawn(kind: Kind, scope: Scope, seed: int, count: int = 300) -> list[Any]:
    rng = random.Random(seed)
    return [kind.draw(rng, scope) for _ in range(count)]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_drawn_spec_is_valid_of_its_kind_and_round_trips_through_json(kind: Kind, scope: Scope) -> None:
    assert kind.offered(scope) == ""
    for spec in _drawn(kind, scope, 7):
        assert spec.invalid() == "", spec
        assert kind_of(spec) is kind and isinstance(spec, kind.spec_type)
        assert spec_from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
        assert spec.describe() and all("=" in tag for tag in kind.tags(spec))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_same_seed_draws_the_same_cases(kind: Kind, scope: Scope) -> None:
    assert _drawn(kind, scope, 1) == _drawn(kind, scope, 1) != _drawn(kind, scope, 2)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_neighbours_are_valid_and_never_the_case_itself(kind: Kind, scope: Scope) -> None:
    for spec in _drawn(kind, scope, 11, 40):
        for n in kind.neighbours(spec):
            assert n != spec and n.invalid() == ""


@pytest.mark.parametrize("module", [layer_training, config_settings, quant_calls], ids=lambda m: m.KIND_NAME)
def test_every_field_of_a_spec_is_one_line_of_its_space(module: Any) -> None:
    spec_fields = {f.name for f in fields(module.KIND.spec_type)} - {"seed"}
    assert {d.name for d in module.DIMENSIONS} == spec_fields


def test_the_layer_space_reaches_the_corners_the_fixed_suite_lacks(scope: Scope) -> None:
    specs = _drawn(layer_training.KIND, scope, 3, 2000)
    assert {s.tp for s in specs} == {1, 2, 3, 4} and any(s.replicas > 1 for s in specs)
    assert any(s.h_out % 8 and s.layer == "column" for s in specs), "unaligned widths"
    assert any(len(s.tokens) > 1 and s.tokens[-1] > s.tokens[0] for s in specs), "a longer micro-batch later"
    assert any(s.uneven() for s in specs), "rows the chunks do not divide"
    assert any(s.autocast for s in specs) and any(s.main_grad for s in specs) and any(s.steps == 3 for s in specs)
    assert {s.chunks for s in specs} == set(layer_training.CHUNKS)


def test_the_configuration_space_reaches_every_value_and_both_outcomes(scope: Scope) -> None:
    specs = _drawn(config_settings.KIND, scope, 3, 3000)
    assert {s.chunks for s in specs} == set(config_settings.CHUNK_VALUES)
    assert {s.customized for s in specs} == set(config_settings.CUSTOMIZED)
    assert any(s.fused and s.tp_size == 8 for s in specs) and any(s.tp_size == 0 for s in specs)
    outcomes = [config_settings.expected_outcome(s.chunks, fused=s.fused, tp_size=s.tp_size) for s in specs]
    assert any(o.must_refuse for o in outcomes) and any(not o.refusals for o in outcomes)


def test_a_layer_case_shrinks_to_its_smallest_failing_neighbourhood(scope: Scope) -> None:
    def longer_later(spec: Any) -> bool:  # a synthetic fault: a later micro-batch longer than the first, row layer
        return spec.layer == "row" and len(spec.tokens) > 1 and spec.tokens[1] > spec.tokens[0]

    start = layer_training.LayerSpec("row", True, 4, 96, 40, (8, 64, 4), replicas=1, dtype="bfloat16", b=2,
                                     chunks=2, steps=3, main_grad=True, straggler_s=0.002, seed=3)
    assert start.invalid() == "" and longer_later(start)
    result = shrink(start, longer_later, layer_training.neighbours, deadline=float("inf"))
    assert result.minimal and longer_later(result.case)
    assert result.case == layer_training.LayerSpec("row", False, 1, 1, 1, (1, 2), chunks=1, seed=3)


@pytest.mark.parametrize("data, why", [
    ({"kind": "layer", "layer": "conv"}, "malformed"),
    ({"kind": "layer", "layer": "conv", "sequence_parallel": False, "tp": 2, "h_in": 4, "h_out": 4,
      "tokens": [4]}, "unknown layer"),
    ({"kind": "layer", "layer": "column", "sequence_parallel": True, "tp": 1, "h_in": 4, "h_out": 4,
      "tokens": [4]}, "sequence parallelism needs tp > 1"),
    ({"kind": "layer", "layer": "column", "sequence_parallel": False, "tp": 2, "h_in": 4, "h_out": 3,
      "tokens": [4]}, "splits h_out=3 over tp=2"),
    ({"kind": "config", "chunks": "12"}, "chunks, customized and incompatible must be among"),
    ({"kind": "config", "tp_size": 9}, "outside 0..8"),
    ({"kind": "config", "colour": "red"}, "malformed"),
])
def test_a_spec_of_another_kind_that_names_no_runnable_case_is_refused(data: dict[str, Any], why: str) -> None:
    with pytest.raises(SpecError, match=why):
        spec_from_dict(data)


def test_the_configuration_model_predicts_the_fixed_tables() -> None:
    """Every row of ``test_config``'s tables with CoC enabled on the command line, as the model sees it."""
    from conformance.suite.test_config import ERRORS, PRECEDENCE, USER_CFG_ERRORS

    def chunks_of(argv: list[str]) -> str | None:
        return argv[argv.index("--coc-parallel-num") + 1] if "--coc-parallel-num" in argv else None

    modelled = 0
    for setting in PRECEDENCE:
        argv = setting.argv
        if "--use-ascend-coc" in argv and not setting.env and chunks_of(argv) is not None:
            outcome = expected_outcome(chunks_of(argv), fused="--coc-fused-kernel" in argv, tp_size=setting.tp)
            assert not outcome.refusals and dict(outcome.effective, **setting.expect) == outcome.effective, setting
            modelled += 1
    keywords = {"use_ascend_mc2": "mc2", "tp_2d": "tp-2d", "transformer_impl": "transformer-engine",
                "num_experts": "moe"}
    for bad in ERRORS:
        if "--use-ascend-coc" in bad.argv and not bad.env:
            incompatible = next((keywords[k] for k in bad.kwargs if k in keywords), None)
            outcome = expected_outcome(chunks_of(bad.argv), fused="--coc-fused-kernel" in bad.argv,
                                       tp_size=bad.kwargs.get("tp_size", 2), incompatible=incompatible)
            assert outcome.must_refuse != bad.or_correct and bad.names in [r.names for r in outcome.refusals], bad
            modelled += 1
    for _, cfgs, names in USER_CFG_ERRORS:
        if "customized_coc" in cfgs:
            outcome = expected_outcome("2", fused=False, tp_size=2, customized=cfgs["customized_coc"])
            assert outcome.must_refuse and [r.names for r in outcome.refusals] == [names], (cfgs, outcome)
            modelled += 1
    assert modelled >= 12


class _NoRanks:
    """Ranks nothing is run on (drawing needs none)."""

    timings = CaseTimings()

    def run(self, fn: Any, world_size: int, **params: Any) -> list[Any]:
        raise AssertionError("drawing runs nothing")


def test_draws_out_of_the_runs_reach_are_counted_and_never_run(scope: Scope) -> None:
    """A node of two devices and ``--coc-tp 2``: every case drawn fits both (configurations, on no ranks, too),
    and what was set aside is counted by why; a shrink never steps out of reach either."""
    narrow = replace(scope, devices=2, tp_sizes=frozenset({2}))
    explorer = Explorer(_NoRanks(), seed=5, budget_s=1.0, scope=narrow)
    drawn = [explorer.draw() for _ in range(300)]
    assert all(spec is not None and not narrow.outside(spec) for spec in drawn)
    assert {spec.world for spec in drawn if spec} == {0, 2} and {spec.tp for spec in drawn if spec} == {0, 2}
    assert any("this node hosts 2" in why for why in explorer.report.outside), explorer.report.outside
    assert any("not among --coc-tp 2" in why for why in explorer.report.outside), explorer.report.outside
    op = next(spec for spec in drawn if isinstance(spec, OpSpec))
    assert narrow.outside(replace(op, tp=1)) == "TP 1 is not among --coc-tp 2"
    assert narrow.outside(replace(op, replicas=2)) == "needs 4 ranks, this node hosts 2"


def test_a_run_that_reaches_no_case_draws_none(scope: Scope) -> None:
    """``--coc-tp 8`` and no configuration cases: nothing the explorer draws is in reach (it draws TP 1-4)."""
    unreachable = replace(scope, configure=False, tp_sizes=frozenset({8}))
    explorer = Explorer(_NoRanks(), seed=1, budget_s=1.0, scope=unreachable)
    assert explorer.draw() is None and sum(explorer.report.outside.values()) == STORMED_DRAWS


def test_one_check_failing_in_one_kind_hides_no_kind_failing_it_later(scope: Scope,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case on ranks crashes: the op calls' crash is shrunk first, and the layers' and the w8A16 calls'
    crashes are found and shrunk too (a failure is told apart by its kind of case as well as its check)."""
    crashed = FailureKey(FINISHED, Level.MUST, "error")

    def crashing(kind: Kind) -> Kind:
        def judge(ranks: Any, spec: Any, scope: Scope, verdicts: Any) -> Judged:
            return Judged(((crashed, "a rank raised"),)) if spec.world else Judged()
        return replace(kind, judge=judge)

    monkeypatch.setattr(explorer_module, "kind_of", lambda spec: crashing(kind_of(spec)))
    ticks = itertools.count()
    explorer = Explorer(_NoRanks(), seed=2, budget_s=400.0, scope=scope, clock=lambda: next(ticks) * 0.01)
    report = explorer.explore()
    assert {kind_of(f.spec).name for f in report.findings} == {"layer", "op", "w8a16"}
    assert {f.key.way for f in report.findings} == {crashed}
    assert {name.split(": ")[0] for name in report.failing_cases} == {"layer", "op", "w8a16"}
    assert all(name.endswith(": " + FINISHED) for name in report.failing_cases)


# --------------------------------------------------------------------------- judged on ranks (a warm gloo pool)


@pytest.fixture(scope="module")
def on_ranks(pool: Any) -> Any:
    """``on_ranks(fault)``: warm gloo ranks running ``fault`` of the faulty implementations, and its scope."""
    from conformance.harness.runner import RankRunner
    from tests.support import faulty_impls

    def ranks_of(fault: str) -> tuple[Any, Scope]:
        impl = getattr(faulty_impls, fault)()
        ranks = RankRunner(pool, None, f"tests.support.faulty_impls:{fault}").for_case(CaseTimings())
        return ranks, Scope.of(impl, declarations(impl), megatron="not drawn here")
    return ranks_of


def _op(m: int, op: str = "matmul_all_reduce", tp: int = 2, **modes: Any) -> OpSpec:
    return OpSpec((Call(m, 64, 32, op=op),), tp=tp, **modes)


def _failed(judged: Judged) -> set[tuple[str, Level]]:
    return {(k.check, k.level) for k, _ in judged.failures}


def test_a_refusal_no_rule_allows_fails_the_op_ran_at_must_and_an_uneven_one_is_judged_as_a_refusal(
        on_ranks: Any) -> None:
    """The fixed suite's refusal rule, through its function: an even token count refused fails "the op ran on
    every rank"; an odd number of rows per rank may be refused, clearly."""
    ranks, scope = on_ranks("RefusesEveryCall")
    refused = op_calls.judge_spec(ranks, _op(64), scope, Verdicts())
    assert ("the op ran on every rank", Level.MUST) in _failed(refused), refused
    uneven = op_calls.judge_spec(ranks, _op(61), scope, Verdicts())
    assert ("token counts: refused clearly", Level.MUST) in {(k.check, k.level) for k in uneven.judged}, uneven
    assert ("token counts: refused clearly", Level.MUST) not in _failed(uneven), uneven
    ranks, scope = on_ranks("RefusesLargeGathers")
    large = op_calls.judge_spec(ranks, _op(2048, "all_gather_matmul"), scope, Verdicts())
    assert ("the op ran on every rank", Level.MUST) in _failed(large), large


def test_an_implementation_refusing_every_call_fails_the_explorer_at_must_at_once(on_ranks: Any) -> None:
    ranks, scope = on_ranks("RefusesEveryCall")
    report = Explorer(ranks, seed=1, budget_s=3.0, scope=scope, kinds=(op_calls.KIND,)).explore()
    ran = [f for f in report.findings if f.key.check == "the op ran on every rank"]
    assert ran and all(f.key.level is Level.MUST for f in ran), [f.key for f in report.findings]
    assert min(f.found_after_s for f in ran) < 30


def test_a_mode_raising_not_implemented_is_not_offered_and_no_longer_drawn(on_ranks: Any) -> None:
    """A correct implementation without a deterministic mode: that mode is reported "not offered" with the
    reason, no case needing it is drawn again, and the exploration passes."""
    ranks, scope = on_ranks("NoDeterministicMode")
    explorer = Explorer(ranks, seed=3, budget_s=4.0, scope=scope, kinds=(op_calls.KIND,))
    deterministic = OpSpec((Call(64, 96, 32),), tp=3, deterministic=True, runs=2)
    judged = explorer.judge(deterministic)
    assert judged.skipped and not judged.failures and not judged.judged, judged
    assert explorer.report.not_offered == {
        "op: deterministic, matmul_all_reduce": "not implemented: deterministic reduction is not implemented"}
    assert explorer.not_offered(replace(deterministic, transpose_weight=True)).startswith("not offered")
    assert explorer.not_offered(replace(deterministic, deterministic=False, runs=1)) == ""
    report = explorer.explore()
    assert report.findings == [] and report.judged_cases > 0, [(f.key, f.message) for f in report.findings]


def test_an_exploration_that_judged_nothing_is_not_judged_never_passed(on_ranks: Any) -> None:
    from conformance.suite.test_explore import _record_judged

    ranks, scope = on_ranks("OffersNoOp")
    report = Explorer(ranks, seed=2, budget_s=3.0, scope=scope, kinds=(op_calls.KIND,)).explore()
    assert report.judged_cases == 0 and report.findings == [] and report.not_offered, report
    assert all("no fused ops in this build" in why for why in report.not_offered.values()), report.not_offered
    verdicts = Verdicts()
    _record_judged(verdicts, report)
    assert [r.outcome for r in verdicts.results] == [NOT_JUDGED], verdicts.results


def test_the_warm_up_case_is_counted_alike_in_the_totals_the_kinds_and_the_dimensions(
        scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    passed = FailureKey("numerics", Level.MUST, "")

    def passing(kind: Kind) -> Kind:
        return replace(kind, judge=lambda ranks, spec, scope, verdicts: Judged(judged=(passed,)))

    monkeypatch.setattr(explorer_module, "kind_of", lambda spec: passing(kind_of(spec)))
    ticks = itertools.count()
    report = Explorer(_NoRanks(), seed=4, budget_s=2.0, scope=scope, clock=lambda: next(ticks) * 0.01).explore()
    assert report.warm_up and sum(report.per_kind.values()) == report.cases == report.judged_cases
    assert sum(report.warm_up.values()) == report.warm_up["config"] + 1  # in-process cases, then one on ranks
    for name, count in report.per_kind.items():
        tp_dimension = "layout" if name == "op" else "tp" if name != "config" else "tp_size"
        tagged = sum(n for tag, n in report.per_dimension.items() if tag.startswith(f"{name}.{tp_dimension}="))
        assert tagged == count, (name, count, tagged)


def test_one_bad_setting_hides_no_other_each_finding_names_its_setting() -> None:
    """TP 0 and CoC with MC2 both accepted: two findings of the same check, each keyed on its setting."""
    from tests.support.faulty_impls import AcceptsTpZeroAndMc2

    impl = AcceptsTpZeroAndMc2()
    ticks = itertools.count()
    report = Explorer(_NoRanks(), seed=1, budget_s=30.0, scope=Scope.of(impl, declarations(impl)),
                      kinds=(config_settings.KIND,), clock=lambda: next(ticks) * 0.01).explore()
    subjects = {f.key.subject for f in report.findings if f.key.level is Level.MUST}
    assert {"tp_size=0", "incompatible=mc2"} <= subjects, [(f.key.name, f.spec.describe()) for f in report.findings]
    assert all(f.key.name == f"{f.key.subject}: {f.key.check}" for f in report.findings)


#: The least share of its kind's draws every bucket of every dimension is drawn in.
FLOOR = 0.02


def _below_the_floor(kind: Kind, specs: list[Any]) -> dict[str, float]:
    """Every ``dimension=bucket`` the kind names that fewer than :data:`FLOOR` of ``specs`` hold, with its share;
    a tag the kind does not name counts as held by none (its dimension names a bucket it never declared)."""
    counts: Counter[str] = Counter(tag for spec in specs for tag in set(kind.tags(spec)))
    named = {f"{name}={bucket}" for name, buckets in kind.buckets().items() for bucket in buckets}
    shares = {tag: counts[tag] / len(specs) for tag in named | set(counts)}
    return {tag: share if tag in named else 0.0 for tag, share in shares.items()
            if share < FLOOR or tag not in named}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_bucket_of_every_dimension_is_drawn_in_at_least_two_percent_of_its_kinds_draws(
        kind: Kind, scope: Scope) -> None:
    """What a night covers: every bucket each dimension names -- those no draw reaches too -- explicit tilings of
    every op, sequences of ops whose results share a shape and dtype."""
    specs = _drawn(kind, scope, seed=0, count=3000)
    assert kind.buckets() and not _below_the_floor(kind, specs), _below_the_floor(kind, specs)
    if kind.name == "op":
        assert {op for s in specs if s.tiling != "own" for op in s.ops} == set(scope.ops)


def test_a_value_drawn_at_weight_zero_fails_the_coverage_floor(scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor holds every bucket a dimension names, not only those drawn: one tiling never drawn fails it."""
    tiling = next(d for d in op_calls.SPEC_DIMENSIONS if d.name == "tiling")
    weights = [0 if t == "halves" else 1 for t in TILINGS]
    never = replace(tiling, draw=space.weighted(TILINGS, weights))
    monkeypatch.setattr(op_calls, "SPEC_DIMENSIONS",
                        space.Space(*(never if d is tiling else d for d in op_calls.SPEC_DIMENSIONS)))
    specs = _drawn(op_calls.KIND, scope, seed=0, count=3000)
    assert not any(s.tiling == "halves" for s in specs)
    assert _below_the_floor(op_calls.KIND, specs) == {"tiling=halves": 0.0}


@pytest.mark.parametrize("groups", [2, 25, 26, 76, 1000])
def test_a_w8a16_case_of_any_number_of_groups_has_its_bucket(groups: int) -> None:
    """A neighbour or a mutation may hold more groups a rank than any draw (76: k=2432, group size 32)."""
    spec = quant_calls.QuantSpec(8, 32 * groups, 16, 1, group_size=32)
    assert spec.invalid() == ""
    bucket = next(t for t in quant_calls.KIND.tags(spec) if t.startswith("groups_per_rank="))
    assert bucket.split("=", 1)[1] in quant_calls.KIND.buckets()["groups_per_rank"]


def test_one_chunk_is_judged_by_its_count_not_by_whether_coc_is_called_enabled(scope: Scope) -> None:
    """``--coc-parallel-num 1`` (one chunk, no overlap; the legacy variable's 1 is off): reporting CoC off for it
    fails its effective settings at SHOULD only."""
    from coc_impl.reference import ReferenceCoC

    class OneIsOff(ReferenceCoC):
        name = "one-is-off"

        def configure(self, argv: Any, env: Any, **kw: Any) -> Any:
            config = super().configure(argv, env, **kw)
            return replace(config, enabled=False) if "1" in (argv or []) else config

    impl = OneIsOff()
    one = replace(config_settings.ConfigSpec(), chunks="1")
    judged = config_settings.judge_spec(_NoRanks(), one, replace(scope, impl=impl), Verdicts())
    assert [(k.check, k.level) for k, _ in judged.failures] == [("effective settings", Level.SHOULD)]


def test_a_failure_that_shrinks_to_one_found_before_is_no_second_finding(scope: Scope) -> None:
    """Chunk counts below one clamped: cases failing on other settings too shrink to the case already found (chunk
    count 0) -- one finding, not one per way there."""
    from tests.support.faulty_impls import ClampsChunkCountConfigureOnly

    impl = ClampsChunkCountConfigureOnly()
    ticks = itertools.count()
    report = Explorer(_NoRanks(), seed=3, budget_s=200.0, scope=Scope.of(impl, declarations(impl)),
                      kinds=(config_settings.KIND,), clock=lambda: next(ticks) * 0.01).explore()
    names = [f.key.name for f in report.findings]
    assert len(names) == len(set(names)) and any(n.startswith("chunks=0") for n in names), names


def test_a_configure_that_raises_for_everything_is_never_refusing_moe_naming_it(scope: Scope) -> None:
    """``NotImplementedError`` for every setting names no setting: "refused, naming the setting" (SHOULD) fails for
    MoE, in an exploration as in the fixed suite (one function judges both), and every valid setting fails."""
    from coc_impl.reference import ReferenceCoC

    class ConfiguresNothing(ReferenceCoC):
        name = "configures-nothing"

        def configure(self, argv: Any, env: Any, **kw: Any) -> Any:
            raise NotImplementedError("configure is not implemented")

    impl = ConfiguresNothing()
    ticks = itertools.count()
    report = Explorer(_NoRanks(), seed=1, budget_s=30.0, scope=Scope.of(impl, declarations(impl)),
                      kinds=(config_settings.KIND,), clock=lambda: next(ticks) * 0.01).explore()
    failed = {name.split(": ", 1)[1] for name in report.failing_cases}
    moe_refusals = {name for _, name, _ in report.judged_checks
                    if "incompatible=moe" in name and name.endswith("refused, naming the setting")}
    assert moe_refusals and moe_refusals <= failed, moe_refusals - failed
    moe = config_settings.judge_spec(_NoRanks(), config_settings.ConfigSpec(incompatible="moe"),
                                     replace(scope, impl=impl), Verdicts())
    assert ("refused, naming the setting", Level.SHOULD) in {(k.check, k.level) for k, _ in moe.failures}


def test_a_wrong_result_beside_a_refused_tiling_fails_the_explorers_case_never_skips_it(on_ranks: Any) -> None:
    """Replayed or drawn, a spec whose own tiling comes back wrong while its explicit one is refused with
    ``NotImplementedError`` (repeated): the result that came back fails its check; only the tiling is not offered
    (issue 50: the whole case was skipped as not offered)."""
    ranks, scope = on_ranks("WrongDefaultTilingRefusesBlocks")
    spec = _op(64, tiling="halves", runs=2, exact=True)
    judged = op_calls.judge_spec(ranks, spec, scope, verdicts := Verdicts())
    assert ("exact layout", Level.MUST) in _failed(judged), judged
    offered = [r for r in verdicts.results if r.outcome == "not offered"]
    assert [r.message for r in offered] == ["matmul_all_reduce tiling [32, 32]: not implemented: explicit tilings "
                                            "(blocks=) are not implemented"], verdicts.results
