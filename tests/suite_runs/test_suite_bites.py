"""The conformance suite fails broken implementations and passes correct ones.

Each row of the proof table (:data:`tests.support.proofs.FAULT_TABLE`) runs one suite module against one fault of
``tests/support/faulty_impls/``, on exactly the smoke tier's cases that the tier's kill table says catch it
(``conformance/smoke_tier.json``, written by ``python -m conformance.bench tiers``), with ``-m smoke``, and reads the
run's JSON summary: every one of them ran (a case the tier no longer holds would be deselected), and together they
prove the row (:meth:`~tests.support.proofs.Proof.shown_by`): the named check came out as the row says -- failed,
at its level and with its failure category, in at least one case, every case that failed it failed (a later refusal
or skip never hides the failure), and no case passed -- or *not judged* where the fault leaves the check nothing to
judge.  A row with ``must_hold`` also proves that no MUST check failed: the fault is one a correct implementation
may have.  So the per-change CI stage catches every fault of the table, at the cases that say so, and a row the
tier no longer catches fails here rather than drifting.

:data:`CORRECT_VARIANTS` are implementations that differ from the reference
without being wrong (of ``faulty_impls``, or ``module:attr``): the same checks
must pass them (or skip as not offered, when the implementation says it lacks
a mode), read from the run's JSON summary: every selected case has the row's
outcome and no check failed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.record.verdicts import outcome_of
from conformance.tiers import smoke_tier
from tests.support.proofs import FAULT_TABLE, FAULTS, MODULE_OPTIONS, Proof
from tests.support.suite_run import SuiteRun

CORRECT = "tests.support.correct_variants"
#: (suite module, correct implementation, -k selection, outcome every selected case must have)
CORRECT_VARIANTS = [
    ("test_ops", "NoDeterministicMode", "deterministic and tp4", "skipped"),
    # a deterministic mode whose GEMM rounds by a tile's rows, declaring no split invariance (issue 42)
    ("test_ops", "RowCountRounding", "deterministic and tp4", "passed"),
    # refusals of a whole case skip it as not offered; one op of a sequence absent, the other is judged
    ("test_ops", "OddRowsNotImplemented", "uneven_token_counts and matmul_all_reduce and tp2", "skipped"),
    ("test_ops", "OffersNoGather", "corner_op_sequence and all_gather_matmul-then", "passed"),
    ("test_ops", "OwnSubgroups", "matmul_all_reduce and (tp_subgroup or results_are_values)", "passed"),
    # collectives issued and waited for through names bound at the implementation's import (issue 26)
    ("test_ops", "AliasBoundCollectives", "results_are_values and tp2", "passed"),
    ("test_layers", "AliasBoundCollectives", "layer_matches_golden and float32 and tp2-p2", "passed"),
    # a genuine overlaps:output where the output block has the weight's shape (issue 26)
    ("test_layers", "DeclaresOverlapsOutput", "layer_matches_golden and mlp-sp-s64b1-h32x32-ffn64 and tp2-p2",
     "passed"),
    # every documented way to wait is a wait, whichever thread waits (issue 42: collect_all failed at TP 8)
    ("test_ops", f"{CORRECT}:WaitsThroughCollectAll", "matmul_all_reduce and (results_are_values or stragglers)",
     "passed"),
    *[("test_ops", f"{CORRECT}:{variant}", "results_are_values and matmul_all_reduce and tp2", "passed")
      for variant in ("WaitsThroughThen", "PollsFutureDone", "PollsWorkIsCompleted", "WaitsOnAHelperThread")],
    # a collective launched and waited inside a then callback, the program waiting on the chained future (issue 50)
    *[("test_ops", f"{CORRECT}:{variant}", "results_are_values and matmul_all_reduce and tp2", "passed")
      for variant in ("ReducesInACallback", "ReducesInAnInlineCallback")],
    # a per-thread workspace of the backward keyed by the weight's version, on the device's one backward thread
    ("test_training", f"{CORRECT}:BackwardThreadWorkspace", "training_steps and column-nosp and tp2", "passed"),
]


#: Correct implementations that use the device as the hardware runs it, on the emulated 8-NPU node (the reference
#: with MC2, where its kernels take the call): (suite module, implementation, -k selection, outcome of every case).
NPU_CORRECT_VARIANTS = [
    # futures complete at enqueue on a device: work chained on them, and the chained futures waited for
    ("test_ops", f"{CORRECT}:AddsBiasInThen", "(op_matches_golden or results_are_values) and matmul_all_reduce and tp2",
     "passed"),
    *[("test_ops", f"{CORRECT}:{variant}", "results_are_values and matmul_all_reduce and tp2", "passed")
      for variant in ("WaitsThroughThen", "PollsFutureDone", "PollsWorkIsCompleted")],
    # per-thread state kept across backwards, on the engine's one long-lived device thread
    ("test_training", f"{CORRECT}:PerThreadBackwardWorkspace",
     "(training_steps or gradient_accumulation_fusion) and column and tp2", "passed"),
]


CPU_PROOFS = [p for p in FAULT_TABLE if p.node == "cpu"]
NPU_PROOFS = [p for p in FAULT_TABLE if p.node == "npu-sim"]


@pytest.mark.parametrize("proof", CPU_PROOFS, ids=[p.id for p in CPU_PROOFS])
def test_suite_catches(run_suite: Callable[..., SuiteRun], tmp_path: Path, proof: Proof) -> None:
    cases = smoke_tier().kills.get(proof.key)
    assert cases, f"{proof.key}: no case of the smoke tier catches it (run `python -m conformance.bench tiers`)"
    summary = tmp_path / "coc-summary.json"
    run = run_suite(proof.module, f"{FAULTS}:{proof.fault}", "-m", "smoke", "--coc-summary", str(summary),
                    *MODULE_OPTIONS.get(proof.module, ()), cases=cases)
    assert summary.is_file(), f"{proof.fault}: no summary written:\n{run.output[-3000:]}"
    records = json.loads(summary.read_text())["cases"]
    assert sorted(r["id"] for r in records) == sorted(cases), f"{proof.key}: the tier's cases that catch it did " \
        f"not all run: {sorted(set(cases) - {r['id'] for r in records})}\n{run.output[-3000:]}"
    problems = proof.shown_by(records)
    assert not problems, f"{proof.fault}: " + "\n".join(problems) + f"\n{run.output[-3000:]}"


@pytest.mark.parametrize("proof", NPU_PROOFS, ids=[p.id for p in NPU_PROOFS])
def test_suite_catches_on_the_emulated_npu_node(run_suite_on_npus: Callable[..., SuiteRun], tmp_path: Path,
                                                proof: Proof) -> None:
    """The rows of faults only an NPU shows, on the emulated 8-NPU node against the reference with MC2 (auto), on
    the tier's cases the row selects: the tier holds the fused kernels' goldens whatever it chose (the kill runs
    are the CPU's, where these faults never reach a kernel)."""
    summary = tmp_path / "coc-summary.json"
    run = run_suite_on_npus(proof.module, f"{FAULTS}:{proof.fault}", "-m", "smoke", "-k", proof.select,
                            "--coc-summary", str(summary), *MODULE_OPTIONS.get(proof.module, ()))
    assert summary.is_file(), f"{proof.fault}: no summary written:\n{run.output[-3000:]}"
    problems = proof.shown_by(json.loads(summary.read_text())["cases"])
    assert not problems, f"{proof.fault}: " + "\n".join(problems) + f"\n{run.output[-3000:]}"


def _passes(run: Callable[..., SuiteRun], tmp_path: Path, module: str, variant: str, select: str,
            outcome: str) -> None:
    summary = tmp_path / "coc-summary.json"
    done = run(module, variant if ":" in variant else f"{FAULTS}:{variant}", "-k", select,
               "--coc-summary", str(summary))
    assert summary.is_file(), f"{variant}: no summary written:\n{done.output[-3000:]}"
    cases = json.loads(summary.read_text())["cases"]
    assert cases and {c["outcome"] for c in cases} == {outcome}, \
        f"{variant}: {[(c['id'], c['outcome']) for c in cases]}\n{done.output[-3000:]}"
    failed = [(c["id"], k["name"]) for c in cases for k in c.get("checks", ()) if outcome_of(k) == "failed"]
    assert not failed, f"{variant}: failed checks {failed}"
    if outcome == "skipped":  # a mode the implementation lacks: recorded as not offered, never as passed
        assert all(c.get("checks") and {outcome_of(k) for k in c["checks"]} == {"not offered"} for c in cases), cases


@pytest.mark.parametrize("module, variant, select, outcome", CORRECT_VARIANTS,
                         ids=[f"{m}-{v}" for m, v, _, _ in CORRECT_VARIANTS])
def test_suite_passes_correct_variants(run_suite: Callable[..., SuiteRun], tmp_path: Path, module: str, variant: str,
                                       select: str, outcome: str) -> None:
    _passes(run_suite, tmp_path, module, variant, select, outcome)


@pytest.mark.parametrize("module, variant, select, outcome", NPU_CORRECT_VARIANTS,
                         ids=[f"{m}-{v.split(':')[-1]}" for m, v, _, _ in NPU_CORRECT_VARIANTS])
def test_suite_passes_correct_variants_on_the_emulated_npu_node(run_suite_on_npus: Callable[..., SuiteRun],
                                                                tmp_path: Path, module: str, variant: str,
                                                                select: str, outcome: str) -> None:
    _passes(run_suite_on_npus, tmp_path, module, variant, select, outcome)


def test_a_check_with_nothing_to_compare_is_never_recorded_passed(run_suite: Callable[..., SuiteRun],
                                                                   tmp_path: Path) -> None:
    """"replicated results bitwise identical" is judged where a result is replicated (the all-reduce at TP 2), and
    not recorded where nothing is (a reduce-scatter's result, TP 1)."""
    summary = tmp_path / "coc-summary.json"
    run_suite("test_ops", "coc_impl.reference:ReferenceCoC", "-k",
              "(op_matches_golden and tp2 and not wT and float32 and (matmul_all_reduce or matmul_reduce_scatter)) "
              "or corner_tp1", "--coc-summary", str(summary))
    cases = json.loads(summary.read_text())["cases"]
    replicated = {c["id"]: [outcome_of(k) for k in c["checks"] if k["name"] == "replicated results bitwise identical"]
                  for c in cases}
    judged = [cid for cid, outcomes in replicated.items() if "matmul_all_reduce" in cid and "tp2" in cid]
    assert judged and all(replicated[cid] == ["passed"] for cid in judged), replicated
    never = [cid for cid in replicated if "matmul_reduce_scatter" in cid or "corner_tp1" in cid]
    assert len(never) >= 5 and all(replicated[cid] == [] for cid in never), replicated


def test_a_wrong_result_beside_a_refusal_is_not_conformant_at_must_in_the_report(run_suite: Callable[..., SuiteRun],
                                                                                 tmp_path: Path) -> None:
    """One row off under its own tiling, explicit tilings refused with ``NotImplementedError``: the run fails and
    its report's verdict is NOT CONFORMANT at MUST (issue 50: "2 skipped", exit 0, a CONFORMANT report)."""
    from conformance.reporting.verdict_view import verdict

    summary = tmp_path / "coc-summary.json"
    run = run_suite("test_ops", f"{FAULTS}:WrongDefaultTilingRefusesBlocks", "-k",
                    "(exact_layout or deterministic) and matmul_reduce_scatter and float32 and (tp2 or tp4)",
                    "--coc-summary", str(summary))
    doc = json.loads(summary.read_text())
    assert run.ret == 1 and doc["outcomes"] == {"failed": 2}, (doc["outcomes"], run.output[-3000:])
    assert verdict(doc, {})["verdict"].startswith("NOT CONFORMANT at MUST"), verdict(doc, {})
