"""The conformance suite fails broken implementations and passes correct ones.

Each row of :data:`FAULT_TABLE` runs one suite module against one fault of
``tests/support/faulty_impls.py``, on the smoke tier (``-m smoke``) narrowed with
``-k`` to the checks meant to catch it, and reads the run's JSON summary: the
named check must come out as the row says -- failed, at its level and with its
failure category, in at least one case, and no selected case may pass -- or
*not judged* where the fault leaves the check nothing to judge.  A row with
``must_hold`` also proves that no MUST check failed: the fault is one a
correct implementation may have.  Running on the smoke tier proves the
per-change CI stage catches every fault of the table.

:data:`CORRECT_VARIANTS` are implementations that differ from the reference
without being wrong: the same checks must pass them (or skip, when the
implementation says it lacks a mode).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.suite_run import SuiteRun

FAULTS = "tests.support.faulty_impls"
#: Extra options per suite module (hangs in configure are meant to be declared quickly).
OPTIONS = {"test_config": ("--coc-tp", "2", "--coc-budget-floor", "8")}

MUST, SHOULD, STRUCTURE = "MUST", "SHOULD", "STRUCTURE"
NUMERIC, CONTRACT, ERROR, OVERLAP = "numeric mismatch", "result contract", "missing or wrong error", "overlap structure"
EVERY_RANK = "test_config_error_on_every_rank_before_any_collective"
NUMERICS = "numerics"
TRAINING = "numerics of every step, micro-batch and replica"
VALUES = "results are values"


@dataclass(frozen=True)
class Proof:
    """One fault and the check that must catch it."""

    module: str
    fault: str
    select: str  #: -k selection of the checks expected to catch it
    check: str  #: the check's name (a regex matched in full)
    level: str
    category: str = ""  #: the failure's category (a regex matched in full); "" for a check not judged
    outcome: str = "failed"  #: or "not judged"
    must_hold: bool = False  #: no MUST check may fail (the fault is allowed of a correct implementation)

    @property
    def id(self) -> str:
        return f"{self.module}-{self.fault}"


FAULT_TABLE = [
    # configuration
    Proof("test_config", "EnvBeatsCommandLine", "effective_config and cli-over-env", "effective settings", SHOULD,
          "failure"),
    Proof("test_config", "SilentOverrides", "effective_config and (cli-over-env or fused-over-num or without-enable)",
          "one warning per overridden or ineffective setting", SHOULD, "failure"),
    Proof("test_config", "UntypedErrors", "refused_naming and mc2", "declared error type", SHOULD, ERROR),
    Proof("test_config", "AcceptsAnyChunkCount", "refused_naming and chunks", "refused, naming the setting", MUST,
          ERROR),
    Proof("test_config", "ChecksOnRankZeroOnly", "every_rank and mc2", EVERY_RANK, MUST, f"{ERROR}|CaseTimeout"),
    Proof("test_config", "AgreesBeforeValidating", "every_rank and mc2", EVERY_RANK, MUST, ERROR),
    Proof("test_config", "ConfigureHangsOnOneRank", "every_rank and mc2-2", EVERY_RANK, MUST, "CaseTimeout"),
    Proof("test_config", "ConfigureRaisesOnOneRank", "every_rank and mc2", EVERY_RANK, MUST, ERROR),
    # fused ops
    Proof("test_ops", "ArrivalOrderReduction", "deterministic and matmul_all_reduce and float32 and tp4",
          "test_deterministic_is_bitwise_reproducible", MUST, "determinism violation"),
    Proof("test_ops", "V2GatheredWrongOrder", "op_matches_golden and v2 and tp2", NUMERICS, MUST, NUMERIC),
    Proof("test_ops", "AntiquantOffsetIgnored", "w8a16_matches and offset and not nooffset and tp2",
          "test_w8a16_matches_dequantised_golden", MUST, NUMERIC),
    Proof("test_ops", "PerGroupAsPerChannel", "w8a16_matches and per_group and float16 and tp2",
          "test_w8a16_matches_dequantised_golden", MUST, NUMERIC),
    # Only all-gather ops see the whole (square) weight; other ops get a k-shard.
    Proof("test_ops", "SquareWeightTransposed",
          "op_matches_golden and all_gather_matmul and m64k64n64 and not wT and not v2", NUMERICS, MUST, NUMERIC),
    Proof("test_ops", "ReduceScatterNeighbourShard", "op_matches_golden and matmul_reduce_scatter and tp2", NUMERICS,
          MUST, NUMERIC),
    Proof("test_ops", "OpUnevenGarbageRows", "uneven_token_counts and matmul_all_reduce and tp2", r"m=\d+: numerics",
          MUST, NUMERIC),
    Proof("test_ops", "OpUnevenTypeError", "uneven_token_counts and matmul_all_reduce and tp2",
          r"m=\d+: refused clearly", MUST, ERROR),
    Proof("test_ops", "RaggedTilingOffset", "exact_layout and matmul_reduce_scatter and tp2", "exact layout", MUST,
          NUMERIC),
    Proof("test_ops", "WrongGroupOps", "tp_subgroup and matmul_all_reduce and world4", NUMERICS, MUST, NUMERIC),
    Proof("test_ops", "CachedOutputBuffer", "results_are_values and tp2 and not v2", VALUES, MUST, CONTRACT),
    Proof("test_ops", "MutatesInput", "results_are_values and matmul_all_reduce and tp2", VALUES, MUST, CONTRACT),
    Proof("test_ops", "ReturnsBeforeWaiting", "stragglers and matmul_all_reduce", VALUES, MUST, CONTRACT),
    Proof("test_ops", "LeaksProcessGroups", "results_are_values and matmul_all_reduce and tp2", VALUES, MUST,
          CONTRACT),
    Proof("test_ops", "ReturnsNone", "op_matches_golden and matmul_all_reduce and tp2 and not wT", VALUES, MUST,
          CONTRACT),
    Proof("test_ops", "ReturnsList", "op_matches_golden and matmul_all_reduce and tp2 and not wT", VALUES, MUST,
          CONTRACT),
    Proof("test_ops", "ReturnsWrongShape", "op_matches_golden and matmul_all_reduce and tp2 and not wT", VALUES,
          MUST, CONTRACT),
    Proof("test_ops", "ReturnsWrongDtype", "op_matches_golden and matmul_all_reduce and tp2 and not wT", VALUES,
          MUST, CONTRACT),
    Proof("test_ops", "ReturnsOnAnotherDevice", "op_matches_golden and matmul_all_reduce and tp2 and not wT", VALUES,
          MUST, CONTRACT),
    Proof("test_ops", "ReplicasRoundDifferently", "op_matches_golden and matmul_all_reduce and float32 and tp2 "
          "and not wT", "replicated results bitwise identical", SHOULD, NUMERIC, must_hold=True),
    # layers
    Proof("test_layers", "DropsLastChunk", "layer_matches_golden and row-nosp and float32 and tp2-p2", NUMERICS, MUST,
          NUMERIC),
    Proof("test_layers", "DuplicatesFirstChunk", "layer_matches_golden and row-nosp and float32 and tp2-p4", NUMERICS,
          MUST, NUMERIC),
    Proof("test_layers", "GathersChunksInWrongOrder", "layer_matches_golden and column-sp and float32 and tp2-p2",
          NUMERICS, MUST, NUMERIC),
    Proof("test_layers", "BiasOnEveryRank", "layer_matches_golden and row-nosp and float32-bias and tp2-p2", NUMERICS,
          MUST, NUMERIC),
    Proof("test_layers", "IgnoresCustomizedCoC", "customized_coc", "customized_coc honoured in every phase", SHOULD,
          OVERLAP),
    Proof("test_layers", "PatchNotApplied", "layer_matches_golden and column-nosp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, OVERLAP),
    Proof("test_layers", "StaleSavedGather", "saved_all_gather and column and tp2", NUMERICS, MUST, NUMERIC),
    Proof("test_layers", "UnevenTokensGarbageRows", "uneven_token_counts and row-nosp and tp2", r".*: numerics", MUST,
          NUMERIC),
    Proof("test_layers", "FusedRowSilentlySerial", "fused_kernel_layers_overlap and row-nosp",
          "the fused path overlaps", STRUCTURE, OVERLAP),
    Proof("test_layers", "AsyncFlagButBlocking", "layer_matches_golden and row-nosp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, OVERLAP),
    Proof("test_layers", "MlpSpBackwardGatherSerial", "layer_matches_golden and mlp-sp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, OVERLAP),
    Proof("test_layers", "WritesIntoItsInput", "layer_matches_golden and row-nosp and float32 and tp2-p2", VALUES,
          MUST, CONTRACT),
    Proof("test_layers", "DeclaresNoOverlap", "layer_matches_golden and row-nosp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, outcome="not judged"),
    # training steps
    Proof("test_training", "WrongGroupLayers", "layers_on_tp_subgroup and row-nosp and world4", TRAINING, MUST,
          NUMERIC),
    Proof("test_training", "StaleWeightCache", "training_steps and row-nosp and tp2", TRAINING, MUST, NUMERIC),
    Proof("test_training", "ReusedOutputWorkspace", "training_steps and row-nosp and tp2", VALUES, MUST, CONTRACT),
    Proof("test_training", "LostGradAccumulation", "gradient_accumulation_fusion and column-nosp and tp2", TRAINING,
          MUST, NUMERIC),
    Proof("test_training", "GradInBothPlaces", "gradient_accumulation_fusion and row-nosp and tp2",
          "gradient lands in main_grad once", MUST, NUMERIC),
]

#: (suite module, correct implementation, -k selection, outcome every selected case must have)
CORRECT_VARIANTS = [
    ("test_ops", "NoDeterministicMode", "deterministic and tp4", "skipped"),
    ("test_ops", "OwnSubgroups", "matmul_all_reduce and (tp_subgroup or results_are_values)", "passed"),
]


def _outcome(check: dict[str, Any]) -> str:
    return str(check.get("outcome") or ("passed" if check["passed"] else "failed"))


def proven(proof: Proof, cases: list[dict[str, Any]]) -> list[str]:
    """What the summary's ``cases`` fail to show of ``proof`` (empty when proven)."""
    records = [(case["id"], check) for case in cases for check in case.get("checks", ())]
    hits = [(cid, c) for cid, c in records if re.fullmatch(proof.check, c["name"]) and c["level"] == proof.level
            and _outcome(c) == proof.outcome and (not proof.category or re.fullmatch(proof.category, c["category"]))]
    problems = [] if hits else [f"no check {proof.check!r} at {proof.level} came out {proof.outcome}"
                                + (f" with category {proof.category!r}" if proof.category else "") + ": "
                                + "; ".join(f"{cid} {c['name']} [{c['level']}] {_outcome(c)} {c['category']}"
                                            for cid, c in records)]
    if proof.outcome == "failed":
        problems += [f"{case['id']} passed" for case in cases if case["outcome"] == "passed"]
        if not cases:
            problems.append("no case ran")
    if proof.must_hold:
        problems += [f"{cid}: MUST check {c['name']} failed: {c['message'][:300]}" for cid, c in records
                     if c["level"] == MUST and _outcome(c) == "failed"]
    return problems


@pytest.mark.parametrize("proof", FAULT_TABLE, ids=[p.id for p in FAULT_TABLE])
def test_suite_catches(run_suite: Callable[..., SuiteRun], tmp_path: Path, proof: Proof) -> None:
    summary = tmp_path / "coc-summary.json"
    run = run_suite(proof.module, f"{FAULTS}:{proof.fault}", "-m", "smoke", "-k", proof.select,
                    "--coc-summary", str(summary), *OPTIONS.get(proof.module, ()))
    assert summary.is_file(), f"{proof.fault}: no summary written:\n{run.output[-3000:]}"
    problems = proven(proof, json.loads(summary.read_text())["cases"])
    assert not problems, f"{proof.fault}: " + "\n".join(problems) + f"\n{run.output[-3000:]}"


@pytest.mark.parametrize("module, variant, select, outcome", CORRECT_VARIANTS,
                         ids=[f"{m}-{v}" for m, v, _, _ in CORRECT_VARIANTS])
def test_suite_passes_correct_variants(run_suite: Callable[..., SuiteRun], module: str, variant: str, select: str,
                                       outcome: str) -> None:
    run = run_suite(module, f"{FAULTS}:{variant}", "-k", select, "-rs")
    counts = {k: v for k, v in run.outcomes.items() if k in ("passed", "failed", "skipped", "errors", "error")}
    assert counts.get(outcome) and set(counts) == {outcome}, f"{variant}: {counts}\n{run.output[-3000:]}"
