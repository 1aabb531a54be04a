"""The conformance suite fails broken implementations (and passes the reference)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import SuiteRun

FAULTS = "tests.faulty_impls"

#: (fault, -k selection of the checks expected to catch it)
CONFIG_FAULTS = [
    ("EnvBeatsCommandLine", "effective_config and cli-over-env"),
    ("SilentOverrides", "effective_config and (cli-over-env or fused-over-num or without-enable)"),
    ("UntypedErrors", "typed_error_names_flags and mc2"),
    ("AcceptsAnyChunkCount", "typed_error_names_flags and chunks"),
    ("ChecksOnRankZeroOnly", "every_rank and mc2"),
    ("AgreesBeforeValidating", "every_rank and mc2"),
]


@pytest.mark.parametrize("fault, select", CONFIG_FAULTS, ids=[f[0] for f in CONFIG_FAULTS])
def test_config_checks_catch(run_suite: Callable[..., SuiteRun], fault: str, select: str) -> None:
    run = run_suite("test_config", f"{FAULTS}:{fault}", "-k", select, "--coc-tp", "2",
                    "--coc-case-timeout", "10")
    assert run.failed, f"{fault} was not caught:\n{run.output[-3000:]}"
    assert not run.passed, f"{fault} passed some of the checks meant to catch it:\n{run.output[-3000:]}"


OP_FAULTS = [
    # Summing two partials commutes exactly; arrival order shows from three ranks on, and
    # reliably only in fp32 outputs (a bf16 cast rounds most reorderings away).
    ("ArrivalOrderReduction", "deterministic and matmul_all_reduce and float32 and tp4"),
    ("V2GatheredWrongOrder", "op_matches_golden and v2 and tp2"),
    ("AntiquantOffsetIgnored", "w8a16_matches and offset and not nooffset and tp2"),
    ("PerGroupAsPerChannel", "w8a16_matches and per_group and float16 and tp2"),
    # Only all-gather ops see the whole (square) weight; other ops get a k-shard.
    ("SquareWeightTransposed", "op_matches_golden and all_gather_matmul and m64k64n64 and not wT and not v2"),
    ("ReduceScatterNeighbourShard", "op_matches_golden and matmul_reduce_scatter and tp2"),
]


@pytest.mark.parametrize("fault, select", OP_FAULTS, ids=[f[0] for f in OP_FAULTS])
def test_op_checks_catch(run_suite: Callable[..., SuiteRun], fault: str, select: str) -> None:
    run = run_suite("test_ops", f"{FAULTS}:{fault}", "-k", select)
    assert run.failed, f"{fault} was not caught:\n{run.output[-3000:]}"
    assert not run.passed, f"{fault} passed checks meant to catch it:\n{run.output[-3000:]}"


LAYER_FAULTS = [
    ("DropsLastChunk", "layer_matches_golden and row-nosp and float32 and tp2-p2"),
    ("DuplicatesFirstChunk", "layer_matches_golden and row-nosp and float32 and tp2-p4"),
    ("GathersChunksInWrongOrder", "layer_matches_golden and column-sp and float32 and tp2-p2"),
    ("BiasOnEveryRank", "layer_matches_golden and row-nosp and float32-bias and tp2-p2"),
    ("IgnoresCustomizedCoC", "customized_coc"),
    ("PatchNotApplied", "layer_matches_golden and column-nosp and float32 and tp2-p2"),
    ("StaleSavedGather", "saved_all_gather and column and tp2"),
]


@pytest.mark.parametrize("fault, select", LAYER_FAULTS, ids=[f[0] for f in LAYER_FAULTS])
def test_layer_checks_catch(run_suite: Callable[..., SuiteRun], fault: str, select: str) -> None:
    run = run_suite("test_layers", f"{FAULTS}:{fault}", "-k", select)
    assert run.failed, f"{fault} was not caught:\n{run.output[-3000:]}"
    assert not run.passed, f"{fault} passed checks meant to catch it:\n{run.output[-3000:]}"
