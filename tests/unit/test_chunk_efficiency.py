"""The chunked-GEMM efficiency table: its computation from timings, and its use by the pipeline model
(``coc-plan``) and by ``auto``'s chunk count (docs/DESIGN.md#the-device-check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coc_impl import autotune
from coc_impl.plan_cli import main as plan_main
from coc_shared import chunk_efficiency
from coc_shared.chunk_efficiency import ChunkedMatmul, ChunkEfficiency, EfficiencyError, ShapeEfficiency, chunk_ratio
from coc_shared.cost_curves import MeasuredCurve
from coc_shared.cost_model import SEED_COSTS_FILE
from conformance.bench import device, gemm_measurements

#: An H100-like table: 8 chunks cost 1.15x the whole at the big shape, 3x at the small one.
TABLE = ChunkEfficiency((ShapeEfficiency(4096, 8192, 8192, {2: 1.02, 4: 1.06, 8: 1.15, 16: 1.4}),
                         ShapeEfficiency(512, 1024, 1024, {2: 1.3, 4: 1.9, 8: 3.0, 16: 5.0})), "cuda", "bfloat16")


def test_the_ratio_is_the_median_of_paired_rounds() -> None:
    # One round was disturbed (the whole product slow): a ratio of medians would say 1.0, paired says 1.2.
    assert chunk_ratio([10.0, 10.0, 30.0], [12.0, 12.0, 12.0]) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="equal, non-empty"):
        chunk_ratio([1.0], [])


def test_the_table_answers_for_any_count_and_shape_from_the_nearest_measured_shape() -> None:
    assert TABLE.ratio(8, 4096, 8192, 8192) == pytest.approx(1.15)
    assert TABLE.ratio(8, 400, 1024, 1024) == pytest.approx(3.0)  # nearest: the small shape
    assert TABLE.ratio(6, 4096, 8192, 8192) == pytest.approx((1.06 + 1.15) / 2)  # between 4 and 8
    assert TABLE.ratio(1, 4096, 8192, 8192) == 1.0 and TABLE.ratio(32, 4096, 8192, 8192) == pytest.approx(1.4)


def test_the_table_round_trips_through_the_device_checks_json(tmp_path: Path) -> None:
    path = tmp_path / "device-check.json"
    path.write_text(json.dumps({"schema": 1, "chunk_efficiency": TABLE.to_dict()}))
    assert chunk_efficiency.load(path) == TABLE
    path.write_text(json.dumps({"chunk_efficiency": {"shapes": [{"m": 1, "k": 1, "n": 1, "ratio": {"1": 0.5}}]}}))
    with pytest.raises(EfficiencyError, match="positive ratios for counts >= 2"):
        chunk_efficiency.load(path)


def test_a_chunked_matmul_costs_its_share_times_the_penalty() -> None:
    whole = MeasuredCurve.of({4096: 800.0})
    curve = ChunkedMatmul(whole, 4096, 8192, 8192, TABLE)
    assert curve(4096) == pytest.approx(800.0)
    assert curve(512) == pytest.approx(1.15 * 800.0 / 8)  # one of 8 chunks
    assert curve.solve(curve(512)) == pytest.approx(512, rel=1e-6)


def test_the_pipeline_model_predicts_less_gain_with_the_devices_efficiency(tmp_path: Path, capsys) -> None:
    args = ["--m", "4096", "--k", "3072", "--n", "8192", "--dtype", "float16", "--costs", str(SEED_COSTS_FILE)]
    assert plan_main(args) == 0
    plain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    path = tmp_path / "device-check.json"
    path.write_text(json.dumps({"chunk_efficiency": TABLE.to_dict()}))
    assert plan_main([*args, "--chunk-efficiency", str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    penalised = json.loads(lines[-1])
    assert any("measured efficiency" in line for line in lines)
    assert penalised["serial_us"] == pytest.approx(plain["serial_us"])  # the whole product is unchanged
    assert penalised["predicted_us"] > plain["predicted_us"]


def test_auto_chooses_from_the_devices_efficiency_instead_of_timing_each_block() -> None:
    """Blocks priced at their share, 8 chunks win; at the small shape's penalty (3x at 8), one block wins."""
    m = 4096
    comm_us = {m: 800.0, m // 2: 400.0, m // 4: 200.0, m // 8: 100.0}
    two = {p: 0.0 for p in (2, 4, 8)}  # no excess beyond the model
    free = autotune.plan({m: 800.0}, comm_us, two, m=m, collective="all_reduce",
                         efficiency=ChunkEfficiency((ShapeEfficiency(m, 8192, 8192, {2: 1.0, 4: 1.0, 8: 1.0}),)),
                         k=8192, n=8192)
    assert free.candidate == 8
    costly = autotune.plan({m: 800.0}, comm_us, two, m=m, collective="all_reduce",
                           efficiency=ChunkEfficiency((ShapeEfficiency(m, 8192, 8192, {2: 2.0, 4: 2.6, 8: 3.0}),)),
                           k=8192, n=8192)
    assert costly.candidate == 1 and costly.predicted_us[8] > free.predicted_us[8]


def test_the_device_check_measures_the_table_on_cpu() -> None:
    table = gemm_measurements.measure_efficiency([("tiny", 64, 32, 32)], "cpu", "float32", chunks=(2, 4), warmup=0,
                                                 repeats=2)
    assert [(s.m, s.k, s.n) for s in table.shapes] == [(64, 32, 32)] and set(table.shapes[0].ratio) == {2, 4}
    assert all(r > 0 for r in table.shapes[0].ratio.values())
    assert "c=4" in table.text(["tiny"])


def test_the_device_checks_json_is_what_the_model_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own output, named by COC_CHUNK_EFFICIENCY, is the table the model and auto use."""
    out = tmp_path / "device-check.json"
    assert device.main(["--only", "efficiency", "--repeats", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["node"]["device"] == "cpu" and doc["chunk_efficiency"]["dtype"] == "float32"
    monkeypatch.setenv(chunk_efficiency.ENV, str(out))
    table = chunk_efficiency.configured()
    shapes = [s[1:] for s in gemm_measurements.CPU_SHAPES]
    assert table is not None and [(s.m, s.k, s.n) for s in table.shapes] == shapes
    assert isinstance(chunk_efficiency.chunked_matmul(MeasuredCurve.of({1024: 1.0}), 1024, 1024, 1024), ChunkedMatmul)
