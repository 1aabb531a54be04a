"""The conformance suite fails broken implementations and passes correct ones.

Each row of :data:`FAULT_TABLE` runs one suite module against one fault of
``tests/support/faulty_impls.py``, on the smoke tier (``-m smoke``) narrowed with
``-k`` to the checks meant to catch it: at least one must fail, none may pass,
and the failure must name the bug class.  Running on the smoke tier proves the
per-change CI stage catches every fault of the table.

:data:`CORRECT_VARIANTS` are implementations that differ from the reference
without being wrong: the same checks must pass them (or skip, when the
implementation says it lacks a mode).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from tests.support.suite_run import SuiteRun

FAULTS = "tests.support.faulty_impls"
#: Extra options per suite module (hangs in configure are meant to be declared quickly).
OPTIONS = {"test_config": ("--coc-tp", "2", "--coc-budget-floor", "8")}

#: (suite module, fault, -k selection of the checks expected to catch it, regex the failure must show)
FAULT_TABLE = [
    # configuration
    ("test_config", "EnvBeatsCommandLine", "effective_config and cli-over-env", r"parallel_num"),
    ("test_config", "SilentOverrides", "effective_config and (cli-over-env or fused-over-num or without-enable)",
     r"warning"),
    ("test_config", "UntypedErrors", "refused_naming and mc2", r"declared|declares no error type"),
    ("test_config", "AcceptsAnyChunkCount", "refused_naming and chunks", r"raised none"),
    ("test_config", "ChecksOnRankZeroOnly", "every_rank and mc2", r"rank"),
    ("test_config", "AgreesBeforeValidating", "every_rank and mc2", r"collectives were issued before"),
    ("test_config", "ConfigureHangsOnOneRank", "every_rank and mc2-2", r"did not finish within"),
    ("test_config", "ConfigureRaisesOnOneRank", "every_rank and mc2", r"raised none"),
    # fused ops
    ("test_ops", "ArrivalOrderReduction", "deterministic and matmul_all_reduce and float32 and tp4", r"bitwise"),
    ("test_ops", "V2GatheredWrongOrder", "op_matches_golden and v2 and tp2", r"gathered input"),
    ("test_ops", "AntiquantOffsetIgnored", "w8a16_matches and offset and not nooffset and tp2", r"violations"),
    ("test_ops", "PerGroupAsPerChannel", "w8a16_matches and per_group and float16 and tp2", r"violations"),
    # Only all-gather ops see the whole (square) weight; other ops get a k-shard.
    ("test_ops", "SquareWeightTransposed",
     "op_matches_golden and all_gather_matmul and m64k64n64 and not wT and not v2", r"violations"),
    ("test_ops", "ReduceScatterNeighbourShard", "op_matches_golden and matmul_reduce_scatter and tp2",
     r"on rank \d rows"),
    ("test_ops", "OpUnevenGarbageRows", "uneven_token_counts and matmul_all_reduce and tp2",
     r"poisoned fill|rows never written"),
    ("test_ops", "RaggedTilingOffset", "exact_layout and matmul_reduce_scatter and tp2", r"exact data"),
    ("test_ops", "WrongGroupOps", "tp_subgroup and matmul_all_reduce and world4", r"wrong group"),
    ("test_ops", "CachedOutputBuffer", "results_are_values and tp2 and not v2",
     r"changed after it was returned|shares memory"),
    ("test_ops", "MutatesInput", "results_are_values and matmul_all_reduce and tp2", r"changed its inputs: x"),
    ("test_ops", "ReturnsBeforeWaiting", "stragglers and matmul_all_reduce", r"never waited"),
    ("test_ops", "LeaksProcessGroups", "results_are_values and matmul_all_reduce and tp2", r"process group"),
    ("test_ops", "ReturnsNone", "op_matches_golden and matmul_all_reduce and tp2 and not wT", r"got NoneType"),
    ("test_ops", "ReturnsList", "op_matches_golden and matmul_all_reduce and tp2 and not wT", r"got list"),
    ("test_ops", "ReturnsWrongShape", "op_matches_golden and matmul_all_reduce and tp2 and not wT",
     r"expected a tensor \[64, 64\]"),
    ("test_ops", "ReturnsWrongDtype", "op_matches_golden and matmul_all_reduce and tp2 and not wT",
     r"torch.float64"),
    ("test_ops", "ReturnsOnAnotherDevice", "op_matches_golden and matmul_all_reduce and tp2 and not wT",
     r"result is on meta"),
    # layers
    ("test_layers", "DropsLastChunk", "layer_matches_golden and row-nosp and float32 and tp2-p2", r"rows"),
    ("test_layers", "DuplicatesFirstChunk", "layer_matches_golden and row-nosp and float32 and tp2-p4", r"rows"),
    ("test_layers", "GathersChunksInWrongOrder", "layer_matches_golden and column-sp and float32 and tp2-p2",
     r"violations"),
    ("test_layers", "BiasOnEveryRank", "layer_matches_golden and row-nosp and float32-bias and tp2-p2", r"y \["),
    ("test_layers", "IgnoresCustomizedCoC", "customized_coc", r"chunk"),
    ("test_layers", "PatchNotApplied", "layer_matches_golden and column-nosp and float32 and tp2-p2",
     r"column/nosp/backward"),
    ("test_layers", "StaleSavedGather", "saved_all_gather and column and tp2", r"dw"),
    ("test_layers", "UnevenTokensGarbageRows", "uneven_token_counts and row-nosp and tp2",
     r"poisoned fill|rows never written"),
    ("test_layers", "FusedRowSilentlySerial", "fused_kernel_layers_overlap and row-nosp", r"row/nosp/forward"),
    ("test_layers", "AsyncFlagButBlocking", "layer_matches_golden and row-nosp and float32 and tp2-p2",
     r"no matmul ran while"),
    ("test_layers", "MlpSpBackwardGatherSerial", "layer_matches_golden and mlp-sp and float32 and tp2-p2",
     r"row/sp/backward"),
    # training steps
    ("test_training", "WrongGroupLayers", "layers_on_tp_subgroup and row-nosp and world4", r"wrong group"),
    ("test_training", "StaleWeightCache", "training_steps and row-nosp and tp2", r"step [12]"),
    ("test_training", "ReusedOutputWorkspace", "training_steps and row-nosp and tp2",
     r"changed after they were returned|share memory"),
    ("test_training", "LostGradAccumulation", "gradient_accumulation_fusion and column-nosp and tp2", r"dw"),
    ("test_training", "GradInBothPlaces", "gradient_accumulation_fusion and row-nosp and tp2",
     r"main_grad \*and\* \.grad"),
]

#: (suite module, correct implementation, -k selection, outcome every selected case must have)
CORRECT_VARIANTS = [
    ("test_ops", "NoDeterministicMode", "deterministic and tp4", "skipped"),
    ("test_ops", "OwnSubgroups", "matmul_all_reduce and (tp_subgroup or results_are_values)", "passed"),
]


@pytest.mark.parametrize("module, fault, select, names", FAULT_TABLE, ids=[f"{m}-{f}" for m, f, _, _ in FAULT_TABLE])
def test_suite_catches(run_suite: Callable[..., SuiteRun], module: str, fault: str, select: str, names: str) -> None:
    run = run_suite(module, f"{FAULTS}:{fault}", "-m", "smoke", "-k", select, *OPTIONS.get(module, ()))
    assert run.failed, f"{fault} was not caught:\n{run.output[-3000:]}"
    assert not run.passed, f"{fault} passed checks meant to catch it:\n{run.output[-3000:]}"
    assert re.search(names, run.output), f"{fault}: no failure names the bug class ({names!r}):\n{run.output[-3000:]}"


@pytest.mark.parametrize("module, variant, select, outcome", CORRECT_VARIANTS,
                         ids=[f"{m}-{v}" for m, v, _, _ in CORRECT_VARIANTS])
def test_suite_passes_correct_variants(run_suite: Callable[..., SuiteRun], module: str, variant: str, select: str,
                                       outcome: str) -> None:
    run = run_suite(module, f"{FAULTS}:{variant}", "-k", select, "-rs")
    counts = {k: v for k, v in run.outcomes.items() if k in ("passed", "failed", "skipped", "errors", "error")}
    assert counts.get(outcome) and set(counts) == {outcome}, f"{variant}: {counts}\n{run.output[-3000:]}"
