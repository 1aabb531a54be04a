"""``coc-plan``: human lines, last-line JSON and argument errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coc_impl.plan_cli import main
from coc_shared.cost_model import SEED_COSTS_FILE
from tests.support import ROOT

SEED_ARGS = [
    "--m",
    "4096",
    "--k",
    "3072",
    "--n",
    "8192",
    "--dtype",
    "float16",
    "--costs",
    str(SEED_COSTS_FILE),
]


def _run(capsys, argv):
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return lines, json.loads(lines[-1])


def test_seed_example(capsys):
    lines, result = _run(capsys, SEED_ARGS)
    assert result["blocks"] == [512, 896, 896, 896, 896]
    assert result["bound"] == "comm"
    assert result["predicted_us"] == pytest.approx(1282.82, abs=0.01)
    assert result["serial_us"] == pytest.approx(1733.94, abs=0.01)
    assert result["ideal_us"] == pytest.approx(1176.98, abs=0.01)
    assert any(line.startswith("blocks: [512, 896, 896, 896, 896]") for line in lines[:-1])
    assert not any(line.startswith("note:") for line in lines)


def test_order_and_inflation_are_used(capsys):
    _, compute_first = _run(capsys, SEED_ARGS)
    _, comm_first = _run(capsys, [*SEED_ARGS, "--order", "comm_first"])
    assert comm_first["order"] == "comm_first"
    assert comm_first["predicted_us"] != compute_first["predicted_us"]
    _, uninflated = _run(capsys, [*SEED_ARGS, "--inflation", "1.0"])
    assert uninflated["blocks"] == [896, 640, 640, 640, 640, 640]


def test_other_shape_scales_matmul_and_notes_it(capsys):
    lines, result = _run(
        capsys,
        ["--m", "4096", "--k", "8192", "--n", "2048", "--dtype", "bfloat16", "--costs", str(SEED_COSTS_FILE)],
    )
    assert any("scaled by FLOPs" in line for line in lines)
    assert result["bound"] == "compute"
    assert len(set(result["blocks"][:-1])) == 1 != len(set(result["blocks"]))  # short block last
    assert sum(result["blocks"]) == 4096


def test_small_m_is_one_block(capsys):
    _, result = _run(capsys, [*SEED_ARGS[:1], "256", *SEED_ARGS[2:]])
    assert result["blocks"] == [256]
    assert result["predicted_us"] == pytest.approx(result["serial_us"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--m", "0", *SEED_ARGS[2:]], "argument --m: expected a positive integer"),
        (["--m", "x", *SEED_ARGS[2:]], "argument --m: expected a positive integer"),
        ([*SEED_ARGS[:6], "--dtype", "float64", *SEED_ARGS[8:]], "argument --dtype: invalid choice"),
        ([*SEED_ARGS, "--inflation", "-1"], "argument --inflation: expected a positive finite number"),
        ([*SEED_ARGS, "--order", "sideways"], "argument --order: invalid choice"),
        (SEED_ARGS[:-2], "the following arguments are required: --costs"),
        ([*SEED_ARGS[:-1], "/nonexistent/costs.json"], "cannot read cost file"),
    ],
)
def test_bad_arguments_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_malformed_cost_file_exits_2(capsys, tmp_path):
    bad = tmp_path / "costs.json"
    bad.write_text(json.dumps({"schema": 1}))
    with pytest.raises(SystemExit) as exc:
        main([*SEED_ARGS[:-1], str(bad)])
    assert exc.value.code == 2
    assert "missing ['comm', 'matmul']" in capsys.readouterr().err


def test_module_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "coc_impl.plan_cli", *SEED_ARGS[:-1], "coc_shared/data/seed_mc2_costs.json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1])["blocks"] == [512, 896, 896, 896, 896]
