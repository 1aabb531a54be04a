"""``python -m conformance.bench bounds``: the device check of the error bound, run small on CPU."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from conformance.bench import bounds

SMALL = ["--device", "cpu", "--k", "128", "--n", "32", "--m", "64,96", "--tp", "2", "--chunks", "3",
         "--data", "shifted"]


def test_chunked_arithmetic_stays_inside_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert bounds.main(SMALL) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(out[-1])
    # 4 ops x 3 dtypes x 2 m, one chunk count, one data kind
    assert figures["points"] == 24 and figures["with_violations"] == 0
    assert 0 < figures["worst_ratio"] < 1


def test_a_chunk_that_loses_rows_is_reported_as_a_violation(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    honest = bounds._serial_and_coc

    def stale_last_rows(*args: Any) -> tuple[Any, ...]:
        serial, coc, *rest = honest(*args)
        coc = coc.clone()
        coc[-3:] = 0  # rows never written, as a dropped last chunk leaves them
        return (serial, coc, *rest)

    monkeypatch.setattr(bounds, "_serial_and_coc", stale_last_rows)
    assert bounds.main([*SMALL, "--dtypes", "bfloat16", "--ops", "matmul_all_reduce"]) == 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["with_violations"] == 2


def test_a_cpu_sweep_leaves_the_cuda_matmul_flags_alone() -> None:
    before = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    points = list(bounds.sweep(bounds._parser().parse_args([*SMALL, "--dtypes", "float16", "--ops", "weight_grad"])))
    assert [p.reduced_precision_reduction for p in points] == [True, True]
    assert torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction == before
