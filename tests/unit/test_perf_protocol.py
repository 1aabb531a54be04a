"""Perf gates: measurement statistics, figures, verdicts, hardware profiles, the auto planner."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from coc_impl import autotune
from coc_shared import timing
from coc_shared.cost_curves import MeasuredCurve
from coc_shared.timeline import simulate
from conformance.bench.coc import targets
from conformance.contract import perf_items
from conformance.judge import hardware, perf, perf_samples
from tests.support.dist_helpers import run_threaded

# ---------------------------------------------------------------- statistics


def test_stats_median_quartiles_and_spread():
    s = perf_samples.Stats.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.q1, s.q3, s.n) == (3.0, 2.0, 4.0, 5)
    assert s.spread == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        perf_samples.Stats.of([])


def test_paired_gains_need_pairs():
    assert perf_samples.paired_gains([10.0, 20.0], [5.0, 25.0]) == [0.5, -0.25]
    with pytest.raises(ValueError, match="unpaired"):
        perf_samples.paired_gains([1.0], [1.0, 2.0])


def test_overlap_efficiency_and_exposed_comm():
    # serial 10 = mm 6 + comm 4; perfect overlap reaches max(6, 4) = 6.
    assert perf.overlap_efficiency(10, 6, 6, 4) == 1.0
    assert perf.overlap_efficiency(10, 10, 6, 4) == 0.0
    assert perf.overlap_efficiency(10, 11, 6, 4) == pytest.approx(-0.25)
    assert perf.overlap_efficiency(6, 5, 6, 4) is None  # nothing to hide
    assert perf.exposed_comm(8, 6) == 2 and perf.exposed_comm(5, 6) == 0
    assert perf.prediction_error(9, 10) == pytest.approx(-0.1)


def test_pooled_appends_rounds_of_common_items():
    assert perf_samples.pooled({"a": [1.0], "b": [2.0]}, {"a": [3.0]}) == {"a": [1.0, 3.0]}


# ---------------------------------------------------------------- interleaving


def test_time_interleaved_warms_up_rotates_and_takes_the_slowest_rank():
    calls: list[str] = []
    ticks = itertools.count()
    items = {name: (lambda name=name: calls.append(name)) for name in "ABC"}
    barriers, syncs, reduced = [], [], []

    def max_over_ranks(values: list[float]) -> list[float]:
        reduced.append(list(values))
        return [v + 1.0 for v in values]  # another rank was 1 ms slower everywhere

    samples = timing.time_interleaved(
        items, timing.Settings(warmup=1, repeats=3), barrier=lambda: barriers.append(1),
        synchronize=lambda: syncs.append(1), max_over_ranks=max_over_ranks,
        clock=lambda: next(ticks) / 1e3,  # every timed call takes 1 ms
    )
    assert calls == list("ABC") + list("ABC") + list("BCA") + list("CAB")
    assert len(barriers) == len(syncs) == 12
    assert len(reduced) == 1 and len(reduced[0]) == 9  # one reduction, at the end
    assert samples == {name: [pytest.approx(2.0)] * 3 for name in "ABC"}


def test_settings_are_validated():
    with pytest.raises(ValueError):
        timing.Settings(warmup=-1)
    with pytest.raises(ValueError):
        timing.Settings(repeats=0)


# ---------------------------------------------------------------- figures


def _samples(serial, coc, *, mm=6.0, comm=4.0, block_mm=3.0, block_comm=2.0, name="coc"):
    return {perf_items.SERIAL: serial, perf_items.MM: [mm] * len(serial), perf_items.COMM: [comm] * len(serial),
            "mm@50": [block_mm] * len(serial), "comm@50": [block_comm] * len(serial), name: coc}


def test_summarize_figures_and_prediction_from_measured_blocks():
    m = perf.summarize(_samples([10.0, 10.0, 10.0], [8.0, 8.0, 8.0]), {"coc": [50, 50]},
                       rows=100, order="compute_first")
    v = m.variants["coc"]
    assert v.gain == pytest.approx(0.2) and v.speedup == pytest.approx(1.25)
    assert v.overlap_efficiency == pytest.approx((10 - 8) / (10 - 6))
    assert v.exposed_comm_ms == pytest.approx(2.0)
    # compute-first, blocks of (mm 3, comm 2): mm 0-3, 3-6; comm 3-5, 6-8.
    assert v.predicted is not None and v.predicted_ms == pytest.approx(8.0)
    assert v.predicted.mm == ((0, 3), (3, 6)) and v.predicted.comm == ((3, 5), (6, 8))
    assert v.prediction_error == pytest.approx(0.0)
    as_json = json.loads(json.dumps(m.as_dict()))
    assert as_json["variants"]["coc"]["blocks"] == [50, 50]
    assert "coc" in perf.table(m)


def test_gain_is_from_medians_and_its_spread_from_pairs():
    m = perf.summarize(_samples([10.0, 20.0, 10.0], [5.0, 25.0, 9.0]), {"coc": None},
                       rows=100, order="compute_first")
    v = m.variants["coc"]
    assert v.gain == pytest.approx(0.1)  # 1 - 9/10
    assert v.paired_gains.median == pytest.approx(0.1)
    assert (v.paired_gains.q1, v.paired_gains.q3) == (pytest.approx(-0.075), pytest.approx(0.3))
    assert v.predicted is None and v.prediction_error is None  # blocks not observed


def test_cpu_demand_is_reported_where_measured():
    # comm 4 ms on each of 2 ranks; its threads burned 6 ms of CPU over both.
    result = {"cpu": {"mm_ms": 9.0, "comm_ms": 6.0, "ranks": 2, "cores": 2}}
    m = perf.summarize(_samples([10.0], [8.0]), {"coc": None}, rows=100, order="compute_first",
                       cpu=perf.cpu_demand(result))
    assert m.as_dict()["comm_cpu_busy"] == pytest.approx(0.75)
    assert "collective 6.0 ms (busy 75% of its time)" in perf.table(m)
    bare = perf.summarize(_samples([10.0], [8.0]), {"coc": None}, rows=100, order="compute_first",
                          cpu=perf.cpu_demand({}))
    assert "cpu_mm_ms" not in bare.as_dict() and "cpu per call" not in perf.table(bare)


def test_no_prediction_without_the_block_costs():
    m = perf.summarize(_samples([10.0], [9.0]), {"coc": [25, 25, 25, 25]}, rows=100, order="comm_first")
    assert m.variants["coc"].predicted is None


def test_measured_curve_interpolates_and_inverts():
    curve = MeasuredCurve.of({100: 10.0, 50: 6.0})
    assert curve(75) == pytest.approx(8.0)
    assert curve.solve(8.0) == pytest.approx(75)
    assert MeasuredCurve.of({100: 10.0})(50) == pytest.approx(5.0)


def test_auto_plans_on_measured_points_however_noisy():
    # Noisy timings where a line through the points would go negative at 128 rows.
    mm_us = {1024: 1000.0, 512: 500.0, 256: 260.0, 128: 120.0}
    comm_us = {1024: 400.0, 512: 900.0, 256: 100.0, 128: 20.0}
    two = {2: 2000.0, 4: 800.0, 8: 400.0}
    d = autotune.plan(mm_us, comm_us, two, m=1024, collective="all_reduce")
    assert all(t > 0 for t in d.predicted_us.values())


# ---------------------------------------------------------------- verdicts


def test_judge_enforces_only_on_matching_hardware():
    assert perf.judge(0.31, 0.30, profile_matches=True) == perf.Verdict(True, True, "gain +31.0% > minimum +30.0%")
    missed = perf.judge(0.30, 0.30, profile_matches=True)
    assert missed.failed and missed.label == "enforced"
    reported = perf.judge(-0.5, 0.30, profile_matches=False, why_not="needs device npu")
    assert not reported.failed and reported.met is False
    assert reported.label == "reported, not gated" and "needs device npu" in reported.reason
    ungated = perf.judge(-0.5, None, profile_matches=True)
    assert not ungated.enforced and ungated.met is None


# ---------------------------------------------------------------- profiles


def test_shipped_profiles_parse_and_detect():
    names = {p.name for p in hardware.shipped()}
    assert {"npu-910b-tp8", "cpu-gloo"} <= names
    assert hardware.matching_profile("npu", "Ascend910B3", 8, "hccl").name == "npu-910b-tp8"
    assert hardware.matching_profile("npu", "Ascend910B3", 4, "hccl") is None
    assert hardware.matching_profile("npu", "Ascend910A", 8, "hccl") is None
    assert hardware.matching_profile("cpu", "AMD EPYC", 2, "gloo").name == "cpu-gloo"
    assert hardware.matching_profile("cpu", "AMD EPYC", 2, "threaded") is None
    assert hardware.matching_profile("cuda", "NVIDIA H100", 8, "nccl") is None


@pytest.mark.parametrize("name", ["Ascend910_9391", "Ascend910_9392", "Ascend910_9382", "Ascend910_9362"])
def test_an_atlas_a3_node_has_its_profile_of_figures_only(name):
    """A3 nodes run the 910B workloads at TP 8 and 16 as figures: no gain was measured there, so none is gated."""
    node = {"device": "npu", "name": name, "backend": "hccl"}
    for tp in (8, 16):
        assert hardware.matching_profile("npu", name, tp, "hccl").name == "npu-a3"
    assert hardware.node_profile(node).name == "npu-a3"
    assert "this node has npu-a3" in hardware.why_not_here(hardware.by_name("unprofiled"), node, 8)
    profile = hardware.by_name("npu-a3")
    assert not profile.enforce and all(g is None for c in profile.cases for g in c.gates.values())
    workloads = {(c.id, c.op, c.m, c.k, c.n) for c in hardware.by_name("npu-910b-tp8").cases}
    assert workloads == {(c.id, c.op, c.m, c.k, c.n) for c in profile.cases if c.tp == 8}
    assert hardware.matching_profile("npu", "Ascend910B3", 8, "hccl").name == "npu-910b-tp8"


def test_mismatch_names_what_differs():
    match = hardware.by_name("npu-910b-tp8").match
    assert match.mismatch("npu", "Ascend910B1", 8, "hccl") == ""
    why = match.mismatch("cpu", "AMD EPYC", 2, "gloo")
    assert "device npu" in why and "TP in [8]" in why and "AMD EPYC" in why


def test_npu_profile_has_the_seed_case_and_every_model_layer():
    profile = hardware.by_name("npu-910b-tp8")
    by_id = {c.id: c for c in profile.cases}
    seed = by_id["mc2-seed"]
    assert (seed.op, seed.m, seed.k, seed.n, seed.tp, seed.dtype) == (
        "matmul_all_reduce", 4096, 3072, 8192, 8, "float16")
    assert seed.gates == {"fused": 0.30}
    layers = [c for c in profile.cases if c.id != "mc2-seed"]
    assert len(layers) == 3 * 4 * 2 and all(c.gates == {"fused": 0.0} for c in layers)
    assert profile.large and all(c.large for c in profile.cases)


@pytest.mark.parametrize("layer, sp, expected", [
    ("qkv", False, ("matmul_all_reduce", 4096, 1280, 8192)),  # (64 + 2*8) * 128 / 8
    ("qkv", True, ("all_gather_matmul", 4096, 8192, 1280)),
    ("fc1", True, ("all_gather_matmul", 4096, 8192, 7168)),  # gated: 2 * 28672 / 8
    ("proj", False, ("matmul_all_reduce", 4096, 1024, 8192)),
    ("fc2", True, ("matmul_reduce_scatter", 4096, 3584, 8192)),
])
def test_llama_layers_become_their_overlapped_pipeline(layer, sp, expected):
    llama = {"hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8, "seq": 4096, "gated": True}
    assert hardware.layer_pipeline(llama, layer, sp, 8) == expected


def _doc(**case):
    return {"schema": 1, "name": "x", "match": {"device": "cpu", "tp": [2]}, "dtype": "float32",
            "cases": [{"id": "c", "op": "matmul_all_reduce", "m": 8, "k": 4, "n": 4, "gates": {"auto": 0.0},
                       **case}]}


@pytest.mark.parametrize("change, message", [
    ({"op": "matmul"}, "op must be one of"),
    ({"gates": {"scripted-3": 0.0}}, "unknown variant"),
    ({"gates": {"auto": "high"}}, "must be a number or null"),
    ({"op": "matmul_reduce_scatter", "m": 7}, "does not fit TP 2"),
])
def test_bad_profiles_are_rejected_with_the_reason(change, message):
    with pytest.raises(hardware.ProfileError, match=message):
        hardware.parse(_doc(**change))


def test_profile_needs_known_schema_and_dtype():
    with pytest.raises(hardware.ProfileError, match="schema"):
        hardware.parse({**_doc(), "schema": 2})
    with pytest.raises(hardware.ProfileError, match="dtype"):
        hardware.parse({**_doc(), "dtype": "int4"})


# ---------------------------------------------------------------- auto planner


def _costs(rows, mm_per_row, comm_per_row):
    return {r: r * mm_per_row for r in rows}, {r: r * comm_per_row for r in rows}


def test_auto_plans_the_best_count_where_overlap_is_free():
    rows = [1024, 512, 256, 128]
    mm_us, comm_us = _costs(rows, 1.0, 1.0)
    # Two-block pipelines exactly as the model predicts: no excess.
    two = {p: simulate((1024 // p,) * 2, _line(1.0), _line(1.0)).makespan for p in (2, 4, 8)}
    d = autotune.plan(mm_us, comm_us, two, m=1024, collective="all_reduce")
    assert d.serial_us == pytest.approx(2048)
    assert d.predicted_us[8] == pytest.approx(1024 + 128)  # p*mm + one block's comm
    assert d.candidate == d.chunks == 8 and d.gain(8) == pytest.approx(1 - 1152 / 2048)


def test_auto_keeps_one_block_where_overlap_costs_as_much_as_it_hides():
    rows = [1024, 512, 256, 128]
    mm_us, comm_us = _costs(rows, 1.0, 1.0)
    # An overlapped step costs mm + comm (lanes share the cores): no gain anywhere.
    two = {p: 4.0 * (1024 // p) for p in (2, 4, 8)}
    d = autotune.plan(mm_us, comm_us, two, m=1024, collective="all_reduce")
    assert d.chunks == 1 and d.candidate == 1
    assert all(d.gain(p) == pytest.approx(0.0, abs=1e-9) for p in (2, 4, 8))


def test_auto_confirmation_rejects_a_candidate_that_is_not_faster():
    rows = [1024, 512]
    mm_us, comm_us = _costs(rows, 1.0, 1.0)
    d = autotune.plan(mm_us, comm_us, {2: 1536.0}, m=1024, collective="all_reduce")
    assert d.candidate == 2
    assert autotune.confirm(d, [2000.0], [1500.0]).chunks == 2
    assert autotune.confirm(d, [2000.0], [1980.0]).chunks == 1
    # Judged per round: the machine slowed down for the candidate's fast rounds too.
    confirmed = autotune.confirm(d, [2000.0, 4000.0, 2000.0], [1800.0, 3000.0, 1800.0])
    assert confirmed.chunks == 2 and confirmed.confirmed_us == (2000.0, 1800.0)
    # Medians alone (4000 vs 1200) would keep it; two of three rounds say it is slower.
    assert autotune.confirm(d, [1000.0, 4000.0, 4100.0], [1200.0, 4200.0, 1000.0]).chunks == 1


def _line(slope):
    from coc_shared.cost_curves import LinearCost

    return LinearCost(slope, 0.0)


def _decide_on_rank(rank: int, world_size: int) -> tuple[int, int, bool]:
    group = torch.distributed.group.WORLD
    kwargs = dict(group=group, dtype=torch.float32, collective="all_reduce")
    first = autotune.decide(256, 32, 64, **kwargs)
    again = autotune.decide(256, 32, 64, **kwargs)
    rs = autotune.choose_chunks(256, 32, 64, group=group, dtype=torch.float32, collective="reduce_scatter",
                                candidates=(1, 2, 4, 8, 256))  # 256 does not divide the 128-row shard
    return first.chunks, rs, again is first


def test_auto_decision_is_collective_safe_and_cached():
    autotune.clear_cache()
    try:
        results = run_threaded(2, _decide_on_rank)
    finally:
        autotune.clear_cache()
    assert results[0] == results[1]  # every rank reaches the same decision
    chunks, rs_chunks, cached = results[0]
    assert chunks in (1, 2, 4, 8) and rs_chunks in (1, 2, 4, 8) and cached


def test_auto_without_a_feasible_count_measures_nothing():
    assert autotune._feasible(6, 4, "reduce_scatter", (1, 2, 4, 8)) == []
    assert autotune._feasible(64, 4, "reduce_scatter", (1, 2, 4, 8)) == [2, 4, 8]
    assert autotune._feasible(12, 4, "all_reduce", (1, 2, 4, 8)) == [2, 4]


# ---------------------------------------------------------------- bench targets


def _variant(gain, ci):
    return {"gain": gain + 0.02, "gain_paired": gain, "gain_paired_ci": ci}  # judged on the paired gain


def test_bench_targets_report_met_and_missed():
    figures = {
        "balanced-ar": {"tp2": {"variants": {"scripted-2": _variant(0.05, [0.0, 0.1]),
                                             "scripted-4": _variant(0.1, [0.095, 0.12]),
                                             "auto": _variant(0.0, [-0.05, 0.04])}},
                        "tp4": {"variants": {"auto": _variant(-0.05, [-0.07, -0.01])}}},
        "other": {"tp2": {"variants": {"auto": _variant(-0.04, [-0.06, -0.035])}}},
    }
    goals = targets(figures)
    best = goals["best_scripted_balanced_tp2"]
    assert best["met"] and best["variant"] == "scripted-4" and best["certainty"] == "clear"
    assert best["speedup"] == pytest.approx(1 / 0.9, abs=1e-4)
    auto = goals["auto_never_slower"]
    assert not auto["met"] and auto["worst"] == "balanced-ar@tp4"
    assert auto["certainty"].startswith("within the noise")  # its interval reaches above -3%
    assert auto["clearly_slower"] == ["other@tp2"]


def test_bench_measures_again_only_where_a_verdict_is_within_the_noise():
    from conformance.bench.coc import _undecided

    def auto_run(auto):
        return perf.summarize(_samples([10.0] * 5, auto, name="auto"), {"auto": [100]}, rows=100, order="compute_first")

    assert not _undecided("any", 2, auto_run([10.0] * 5))  # paired gains all 0: clearly above -3 %
    assert _undecided("any", 2, auto_run([11.0, 9.0, 10.5, 9.5, 10.0]))  # -10 %..+10 %: straddles -3 %


def test_median_ci_brackets_the_median_and_narrows_with_samples():
    few = perf_samples.median_ci([0.1, -0.1, 0.05, 0.0, 0.02])
    many = perf_samples.median_ci([0.1, -0.1, 0.05, 0.0, 0.02] * 20)
    assert few[0] <= 0.02 <= few[1] and many[0] <= 0.02 <= many[1]
    assert many[1] - many[0] < few[1] - few[0]
    assert perf_samples.median_ci([1.0, 2.0, 3.0]) == perf_samples.median_ci([1.0, 2.0, 3.0])  # reproducible


# ---------------------------------------------------------------- rank side


@pytest.fixture(scope="module")
def gloo_ranks():
    from conformance.harness.launchers.devices import cpu
    from conformance.harness.launchers.process_launcher import ProcessLauncher

    launcher = ProcessLauncher(cpu(2), max_live_ranks=2)
    yield launcher
    launcher.close()


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul"])
def test_rank_side_times_every_item_and_the_reused_buffer_reference(gloo_ranks, op):
    """The serial-reused reference row runs without any implementation capability, on every op."""
    from conformance.cases.perf_cases import pipeline_perf_case, variant_reason
    from conformance.contract.perf_items import SERIAL_REUSED
    from conformance.harness.case import RankTask
    assert variant_reason(object(), SERIAL_REUSED, op) is None
    params = dict(op=op, m=64, k=16, n=32, dtype="float32", variants=["scripted-2", SERIAL_REUSED],
                  warmup=1, repeats=2)
    outcomes = gloo_ranks.run(RankTask(pipeline_perf_case, 2, params), (), "coc_impl.reference:ReferenceCoC")
    assert all(o.ok for o in outcomes), [o.error.traceback for o in outcomes if o.error]
    result = outcomes[0].value
    assert {perf_items.SERIAL, perf_items.MM, perf_items.COMM, "scripted-2", SERIAL_REUSED} <= result["samples"].keys()
    assert result["blocks"][SERIAL_REUSED] == [64] and len(result["blocks"]["scripted-2"]) == 2
    assert result["cpu"]["ranks"] == 2 and result["cpu"]["mm_ms"] > 0


# ---------------------------------------------------------------- profiles by identity


H100 = {"device": "cuda", "name": "NVIDIA H100 80GB HBM3", "backend": "nccl"}
CPU_GLOO = {"device": "cpu", "name": "AMD EPYC", "backend": "gloo"}


def test_a_profile_runs_only_where_its_identity_matches():
    cpu, npu = hardware.by_name("cpu-gloo"), hardware.by_name("npu-910b-tp8")
    assert hardware.why_not_here(cpu, CPU_GLOO, 2) == ""
    why = hardware.why_not_here(cpu, H100, 2)
    assert why.startswith("profile cpu-gloo is not this node's") and "device cpu" in why and "H100" in why
    assert "backend gloo" in hardware.why_not_here(cpu, {**CPU_GLOO, "backend": "threaded"}, 2)
    assert "TP in [8]" in hardware.why_not_here(npu, {"device": "npu", "name": "Ascend910B3",
                                                       "backend": "hccl"}, 4)


def test_a_node_no_profile_names_runs_the_figures_only_profile():
    """An H100 node has no profile: it measures ``unprofiled`` (gates nothing); a CPU gloo node has
    ``cpu-gloo``, so it never runs ``unprofiled`` (its default run keeps its cases)."""
    figures = hardware.by_name("unprofiled")
    assert figures.match.anywhere and not figures.enforce
    assert figures.cases and all(gate is None for case in figures.cases for gate in case.gates.values())
    assert hardware.why_not_here(figures, H100, 2) == ""
    assert hardware.matching_profile(H100["device"], H100["name"], 2, H100["backend"]) is None
    assert "this node has cpu-gloo" in hardware.why_not_here(figures, CPU_GLOO, 2)


def test_rank_side_times_a_perf_case_on_the_emulated_npu_node(tmp_path, monkeypatch):
    """On HCCL ranks (the emulated NPU node: hccl, MC2 under the reference with auto) the ranks agree on their timings
    in a dtype HCCL reduces (the float64 all-reduce of the timings failed every perf case on an NPU node)."""
    from conformance.cases.perf_cases import pipeline_perf_case
    from conformance.harness.case import RankTask
    from conformance.harness.launchers.devices import DeviceKind
    from conformance.harness.launchers.process_launcher import ProcessLauncher

    monkeypatch.setenv("NPU_SIM", "1")
    monkeypatch.setenv("NPU_SIM_NODE_DIR", str(tmp_path / "node"))
    launcher = ProcessLauncher(DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", 2, emulated=True),
                               max_live_ranks=2)
    try:
        params = dict(op="matmul_all_reduce", m=64, k=512, n=64, dtype="bfloat16", variants=["scripted-2", "fused"],
                      warmup=1, repeats=2)
        outcomes = launcher.run(RankTask(pipeline_perf_case, 2, params), ("0", "1"),
                                "coc_impl.reference:ReferenceCoCAuto")
    finally:
        launcher.close()
    assert all(o.ok for o in outcomes), [o.error.traceback for o in outcomes if o.error]
    result = outcomes[0].value
    assert {"scripted-2", "fused"} <= result["samples"].keys()
    assert result["identity"] == {"device": "npu-sim", "name": "Ascend910B3", "backend": "hccl", "tp": 2}
