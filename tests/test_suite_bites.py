"""The conformance suite fails broken implementations (and passes the reference).

Each row runs one suite module against one fault of ``tests/faulty_impls.py``,
selecting (``-k``) the checks meant to catch it: at least one must fail and
none may pass.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import SuiteRun

FAULTS = "tests.faulty_impls"
#: Extra options per suite module (config hangs are detected quickly on purpose).
OPTIONS = {"test_config": ("--coc-tp", "2", "--coc-case-timeout", "10")}

#: (suite module, fault, -k selection of the checks expected to catch it)
FAULT_TABLE = [
    ("test_config", "EnvBeatsCommandLine", "effective_config and cli-over-env"),
    ("test_config", "SilentOverrides", "effective_config and (cli-over-env or fused-over-num or without-enable)"),
    ("test_config", "UntypedErrors", "typed_error_names_flags and mc2"),
    ("test_config", "AcceptsAnyChunkCount", "typed_error_names_flags and chunks"),
    ("test_config", "ChecksOnRankZeroOnly", "every_rank and mc2"),
    ("test_config", "AgreesBeforeValidating", "every_rank and mc2"),
    # Summing two partials commutes exactly; arrival order shows from three ranks on, and
    # reliably only in fp32 outputs (a bf16 cast rounds most reorderings away).
    ("test_ops", "ArrivalOrderReduction", "deterministic and matmul_all_reduce and float32 and tp4"),
    ("test_ops", "V2GatheredWrongOrder", "op_matches_golden and v2 and tp2"),
    ("test_ops", "AntiquantOffsetIgnored", "w8a16_matches and offset and not nooffset and tp2"),
    ("test_ops", "PerGroupAsPerChannel", "w8a16_matches and per_group and float16 and tp2"),
    # Only all-gather ops see the whole (square) weight; other ops get a k-shard.
    ("test_ops", "SquareWeightTransposed",
     "op_matches_golden and all_gather_matmul and m64k64n64 and not wT and not v2"),
    ("test_ops", "ReduceScatterNeighbourShard", "op_matches_golden and matmul_reduce_scatter and tp2"),
    ("test_layers", "DropsLastChunk", "layer_matches_golden and row-nosp and float32 and tp2-p2"),
    ("test_layers", "DuplicatesFirstChunk", "layer_matches_golden and row-nosp and float32 and tp2-p4"),
    ("test_layers", "GathersChunksInWrongOrder", "layer_matches_golden and column-sp and float32 and tp2-p2"),
    ("test_layers", "BiasOnEveryRank", "layer_matches_golden and row-nosp and float32-bias and tp2-p2"),
    ("test_layers", "IgnoresCustomizedCoC", "customized_coc"),
    ("test_layers", "PatchNotApplied", "layer_matches_golden and column-nosp and float32 and tp2-p2"),
    ("test_layers", "StaleSavedGather", "saved_all_gather and column and tp2"),
]


@pytest.mark.parametrize("module, fault, select", FAULT_TABLE, ids=[f"{m}-{f}" for m, f, _ in FAULT_TABLE])
def test_suite_catches(run_suite: Callable[..., SuiteRun], module: str, fault: str, select: str) -> None:
    run = run_suite(module, f"{FAULTS}:{fault}", "-k", select, *OPTIONS.get(module, ()))
    assert run.failed, f"{fault} was not caught:\n{run.output[-3000:]}"
    assert not run.passed, f"{fault} passed checks meant to catch it:\n{run.output[-3000:]}"
