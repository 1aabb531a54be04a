"""Cost functions, their inverses, fitting and the cost-file schema."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coc_shared.cost_curves import MB, LinearCost, PiecewiseQuadLinearCost, fit_comm, fit_matmul
from coc_shared.cost_model import (
    SEED_COSTS_FILE,
    CommCost,
    CostFileError,
    CostModels,
    MatmulCost,
    load_costs,
    save_costs,
)

SEED_COMM = PiecewiseQuadLinearCost(8.0, (-0.9698202, 27.0622573, 14.769), (13.58491263, 61.508333))


def test_seed_comm_fit_values():
    # The seed's own example: 384 rows of 8192 fp16 = 6 MB -> ~143 us (142.2 exactly).
    assert SEED_COMM(6.0) == pytest.approx(-0.9698202 * 36 + 27.0622573 * 6 + 14.769)
    assert SEED_COMM(6.0) == pytest.approx(142.229, abs=1e-3)
    # At and above the breakpoint the linear piece applies.
    assert SEED_COMM(8.0) == pytest.approx(13.58491263 * 8 + 61.508333)
    assert SEED_COMM(7.999) == pytest.approx(-0.9698202 * 7.999**2 + 27.0622573 * 7.999 + 14.769)


def test_comm_cost_converts_rows_to_megabytes():
    comm = CommCost(SEED_COMM, n=8192, dtype_size=2)
    assert comm(384) == pytest.approx(SEED_COMM(6.0))
    assert comm(4096) == pytest.approx(SEED_COMM(64.0))
    assert CommCost(SEED_COMM, n=8192, dtype_size=4)(384) == pytest.approx(SEED_COMM(12.0))


@pytest.mark.parametrize("t", [20.0, 142.229, 169.0, 170.19, 500.0, 2000.0])
def test_piecewise_solve_inverts_both_pieces(t):
    x = SEED_COMM.solve(t)
    assert SEED_COMM(x) == pytest.approx(t, rel=1e-9)


def test_piecewise_solve_edges():
    # At or below f(0) nothing is needed.
    assert SEED_COMM.solve(14.769) == 0.0
    assert SEED_COMM.solve(-5.0) == 0.0
    # The seed's pieces do not meet exactly at 8 MB (169.2 vs 170.2 us): a time in
    # the jump is first reached at the breakpoint.
    assert SEED_COMM(7.9999999) < 169.9 < SEED_COMM(8.0)
    assert SEED_COMM.solve(169.9) == 8.0
    # A fit with a hump below the breakpoint: the first size reaching t counts.
    hump = PiecewiseQuadLinearCost(10.0, (-1.0, 10.0, 0.0), (5.0, 0.0))
    assert hump.solve(16.0) == pytest.approx(2.0)
    assert hump.solve(30.0) == 10.0  # above the hump's peak of 25: first reached at the jump
    # A flat linear piece never reaches a time above it.
    flat = PiecewiseQuadLinearCost(1.0, (0.0, 1.0, 0.0), (0.0, 1.0))
    assert flat.solve(2.0) == math.inf


def test_linear_solve():
    f = LinearCost(2.0, 10.0)
    assert f.solve(30.0) == 10.0
    assert f.solve(5.0) == 0.0
    assert LinearCost(0.0, 1.0).solve(2.0) == math.inf


@given(
    a=st.floats(-1.0, 1.0),
    b=st.floats(20.0, 40.0),
    c=st.floats(0.0, 50.0),
    slope=st.floats(0.5, 30.0),
    r=st.floats(0.01, 100.0),
    x=st.floats(0.0, 100.0),
)
def test_rescaled_is_composition(a, b, c, slope, r, x):
    f = PiecewiseQuadLinearCost(8.0, (a, b, c), (slope, 60.0))
    assert f.rescaled(r)(x) == pytest.approx(f(r * x), rel=1e-9, abs=1e-9)
    g = LinearCost(slope, c)
    assert g.rescaled(r)(x) == pytest.approx(g(r * x), rel=1e-9, abs=1e-9)


@settings(max_examples=50)
@given(b=st.floats(10.0, 40.0), c=st.floats(0.0, 50.0), slope=st.floats(5.0, 30.0), t=st.floats(0.0, 5000.0))
def test_solve_is_smallest_size_reaching_t(b, c, slope, t):
    # Increasing quadratic (vertex beyond the breakpoint) and a rising line.
    f = PiecewiseQuadLinearCost(8.0, (-0.5, b, c), (slope, c))
    x = f.solve(t)
    assert f(x) >= t - 1e-6 * max(1.0, t)
    if x > 0:
        assert f(x * (1 - 1e-6)) < t + 1e-6 * max(1.0, t)


def test_matmul_for_shape_scales_by_flops():
    mm = MatmulCost(LinearCost(0.2, 5.0), k=3072, n=8192)
    assert mm.for_shape(3072, 8192) is mm
    wide = mm.for_shape(6144, 8192)
    assert (wide.k, wide.n) == (6144, 8192)
    assert wide(1000) == pytest.approx(0.4 * 1000 + 5.0)
    assert wide.solve(wide(1000)) == pytest.approx(1000)


def test_fit_matmul_recovers_line():
    ms = [256, 512, 768, 1024, 2048]
    fit = fit_matmul(ms, [0.196 * m + 7.5 for m in ms])
    assert fit.slope == pytest.approx(0.196)
    assert fit.intercept == pytest.approx(7.5)


def test_fit_comm_recovers_seed_pieces():
    mb = np.array([1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64], dtype=float)
    times = [SEED_COMM(x) for x in mb]
    fit = fit_comm(mb * MB, times, breakpoint_mb=8)
    assert isinstance(fit, PiecewiseQuadLinearCost)
    assert fit.breakpoint == 8.0
    assert fit.below == pytest.approx(SEED_COMM.below, rel=1e-6)
    assert fit.above == pytest.approx(SEED_COMM.above, rel=1e-6)


def test_fit_comm_linear_and_too_few_points():
    mb = np.array([4.0, 8.0, 16.0])
    line = fit_comm(mb * MB, 3.0 * mb + 2.0, breakpoint_mb=None)
    assert isinstance(line, LinearCost)
    assert (line.slope, line.intercept) == pytest.approx((3.0, 2.0))
    with pytest.raises(ValueError, match="needs >= 3 points below"):
        fit_comm(mb * MB, 3.0 * mb, breakpoint_mb=8)
    with pytest.raises(ValueError, match="equal length"):
        fit_matmul([1, 2, 3], [1, 2])


def test_seed_cost_file():
    models = load_costs(SEED_COSTS_FILE)
    mm, comm = models.bind(3072, 8192, 2)
    assert mm(4096) == pytest.approx(803.0)
    assert mm(0) == 0.0
    assert comm(384) == pytest.approx(SEED_COMM(6.0))
    assert models.comm == SEED_COMM


def test_cost_file_round_trip(tmp_path):
    models = CostModels(MatmulCost(LinearCost(0.25, 3.0), 1024, 4096), SEED_COMM, {"device": "cpu"})
    path = tmp_path / "costs.json"
    save_costs(models, path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1
    assert doc["comm"] == {"x": "MB", **SEED_COMM.to_dict()}
    loaded = load_costs(path)
    assert loaded == models
    assert loaded.meta["device"] == "cpu"


def _seed_doc():
    return json.loads(SEED_COSTS_FILE.read_text())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema=2), "schema 2 is not supported"),
        (lambda d: d.pop("comm"), r"missing \['comm'\]"),
        (lambda d: d["matmul"].update(kind="cubic"), "matmul.kind must be one of"),
        (lambda d: d["matmul"].pop("k"), r"missing \['k'\]"),
        (lambda d: d["matmul"].update(k=0), "positive integers"),
        (lambda d: d["comm"].update(x="bytes"), "comm.x must be 'MB'"),
        (lambda d: d["comm"].update(slope=1.0), r"unknown \['slope'\]"),
        (lambda d: d["comm"].update(below=[1.0, 2.0]), "below needs"),
        (lambda d: d["comm"].update(breakpoint="8"), "finite number"),
    ],
)
def test_cost_file_defects_are_config_errors(tmp_path, mutate, message):
    doc = _seed_doc()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(CostFileError, match=message):
        load_costs(path)


def test_unreadable_cost_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(CostFileError, match="cannot read cost file"):
        load_costs(path)
    with pytest.raises(CostFileError, match="cannot read cost file"):
        load_costs(tmp_path / "missing.json")
