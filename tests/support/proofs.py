"""The proof table: every named check of the suite, and the fault of ``tests/support/faulty_impls/`` that proves it.

A check is proven when a fault makes it come out as a row of :data:`FAULT_TABLE`
says (:meth:`Proof.shown_by`), and a case that failed it comes out failed (a
failure is never lost to what follows it).  ``tests/suite_runs/test_suite_bites.py``
runs each row's fault on the smoke-tier cases that catch it, which
``python -m conformance.bench tiers`` finds by running each fault on its whole
module and stores with the tier (``conformance/smoke_tier.json``).  Every named
check of the suite -- each ``verdicts.check`` name, and each test that judges
without one -- has a row, or an entry in :data:`UNPROVEN` saying why not
(``tests/unit/test_proofs.py`` holds the suite to that).

``python -m tests.support.proofs`` prints the check -> fault table.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.record.verdicts import outcome_of
from tests.support import ROOT

#: The module of the faults the rows name (``--coc-impl FAULTS:<fault>``).
FAULTS = "tests.support.faulty_impls"
SUITE = ROOT / "conformance" / "suite"

MUST, SHOULD, STRUCTURE = "MUST", "SHOULD", "STRUCTURE"
NUMERIC, CONTRACT, ERROR, OVERLAP = "numeric mismatch", "result contract", "missing or wrong error", "overlap structure"
EVERY_RANK = "test_config_error_on_every_rank_before_any_collective"
NUMERICS = "numerics"
VALUES = "results are values"
#: Extra options of every run of a suite module against a fault (hangs in configure are meant to be declared quickly).
MODULE_OPTIONS = {"test_config": ("--coc-tp", "2", "--coc-budget-floor", "8")}


@dataclass(frozen=True)
class Proof:
    """One fault and the check that must catch it."""

    module: str
    fault: str
    #: -k selection of the cases the row was written against (for the reader: the smoke tier's kill table says
    #: which cases prove it)
    select: str
    check: str  #: the check's name (a regex matched in full)
    level: str
    category: str = ""  #: the failure's category (a regex matched in full); "" for a check not judged
    outcome: str = "failed"  #: or "not judged"
    must_hold: bool = False  #: no MUST check may fail (the fault is allowed of a correct implementation)
    says: str = ""  #: what the failing check's message must name (a regex searched in it)
    #: where the fault shows: ``cpu`` (the default node), or ``npu-sim``: the emulated 8-NPU node
    #: (``--coc-emulate-npu``), for misuses of what only an NPU has (torch_npu's MC2 kernels)
    node: str = "cpu"

    @property
    def id(self) -> str:
        return f"{self.module}-{self.fault}"

    @property
    def key(self) -> str:
        """The row as the smoke tier's kill table names it (a fault may prove several checks)."""
        return f"{self.id}: {self.check} [{self.level} {self.outcome}]"

    def shown_by(self, cases: list[dict[str, Any]]) -> list[str]:
        """What the JSON summary's ``cases`` fail to show of this row (empty when they prove it): the check came
        out as the row says (saying :attr:`says`) in at least one case, every case that failed it came out failed,
        and (a failing row) none passed; with :attr:`must_hold`, no MUST check failed."""
        records = [(case["id"], check) for case in cases for check in case.get("checks", ())]
        hits = [(cid, c) for cid, c in records if re.fullmatch(self.check, c["name"]) and c["level"] == self.level
                and outcome_of(c) == self.outcome and (not self.category or re.fullmatch(self.category, c["category"]))
                and (not self.says or re.search(self.says, c["message"]))]
        problems = [] if hits else [f"no check {self.check!r} at {self.level} came out {self.outcome}"
                                    + (f" with category {self.category!r}" if self.category else "")
                                    + (f" saying {self.says!r}" if self.says else "") + ": "
                                    + "; ".join(f"{cid} {c['name']} [{c['level']}] {outcome_of(c)} {c['category']}"
                                                for cid, c in records)]
        if self.outcome == "failed":
            problems += [f"{case['id']} passed" for case in cases if case["outcome"] == "passed"]
            failed_it = {cid for cid, _ in hits}
            problems += [f"{case['id']} failed {self.check!r} yet came out {case['outcome']}" for case in cases
                         if case["id"] in failed_it and case["outcome"] not in ("failed", "not-gated")]
            if not cases:
                problems.append("no case ran")
        if self.must_hold:
            problems += [f"{cid}: MUST check {c['name']} failed: {c['message'][:300]}" for cid, c in records
                         if c["level"] == MUST and outcome_of(c) == "failed"]
        return problems


FAULT_TABLE = [
    # configuration
    Proof("test_config", "EnvBeatsCommandLine", "effective_config and cli-over-env", "effective settings", SHOULD,
          "failure"),
    Proof("test_config", "SilentOverrides", "effective_config and (cli-over-env or fused-over-num or without-enable)",
          "one warning per overridden or ineffective setting", SHOULD, "failure"),
    Proof("test_config", "UntypedErrors", "refused_naming and mc2", "declared error type", SHOULD, ERROR),
    Proof("test_config", "AcceptsMoE", "refused_naming and moe", "refused, naming the setting", SHOULD, ERROR,
          must_hold=True),
    Proof("test_config", "AcceptsEverything", "each_cause", "test_each_cause_has_its_own_error_type", SHOULD,
          outcome="not judged"),
    Proof("test_config", "AcceptsAnyChunkCount", "refused_naming and chunks", "refused, naming the setting", MUST,
          ERROR),
    Proof("test_config", "ChecksOnRankZeroOnly", "every_rank and mc2", EVERY_RANK, MUST, f"{ERROR}|CaseTimeout"),
    Proof("test_config", "AgreesBeforeValidating", "every_rank and mc2", EVERY_RANK, MUST, ERROR),
    Proof("test_config", "ConfigureHangsOnOneRank", "every_rank and mc2-2", EVERY_RANK, MUST, "CaseTimeout"),
    Proof("test_config", "ConfigureRaisesOnOneRank", "every_rank and mc2", EVERY_RANK, MUST, ERROR),
    Proof("test_config", "RefusesMC2WhileOff", "incompatibilities_only_apply",
          "test_incompatibilities_only_apply_when_enabled", MUST, ERROR),
    # fused ops
    Proof("test_ops", "ArrivalOrderReduction", "deterministic and matmul_all_reduce and float32 and tp4",
          "deterministic: bitwise reproducible", MUST, "determinism violation"),
    Proof("test_ops", "ClaimsSplitInvariance", "deterministic and matmul_all_reduce and float32 and tp4",
          "split-invariant: bitwise across tilings", MUST, "determinism violation"),
    # the same bits within a process, others on fresh ranks (issue 50: every session passed with other bits)
    Proof("test_ops", "PlanFixedPerProcess", "deterministic and matmul_all_reduce and float32 and tp4",
          "deterministic: bitwise across launches", MUST, "determinism violation"),
    # rounding by a tile's rows, declaring no split invariance: correct (its tilings within the error bound)
    Proof("test_ops", "RowCountRounding", "deterministic and matmul_all_reduce and float32 and tp4",
          "split-invariant: bitwise across tilings", MUST, outcome="not judged", must_hold=True),
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
    Proof("test_ops", "OpUnevenGarbageRows", "uneven_token_counts and matmul_all_reduce and tp2", r".*: numerics",
          MUST, NUMERIC),
    Proof("test_ops", "OpUnevenTypeError", "uneven_token_counts and matmul_all_reduce and tp2",
          r".*: refused clearly", MUST, ERROR),
    Proof("test_ops", "RaggedTilingOffset", "exact_layout and matmul_reduce_scatter and tp2", "exact layout", MUST,
          NUMERIC),
    Proof("test_ops", "WrongGroupOps", "tp_subgroup and matmul_all_reduce and world4", NUMERICS, MUST, NUMERIC),
    Proof("test_ops", "CachedOutputBuffer", "results_are_values and tp2 and not v2", VALUES, MUST, CONTRACT),
    Proof("test_ops", "MutatesInput", "results_are_values and matmul_all_reduce and tp2", VALUES, MUST, CONTRACT),
    Proof("test_ops", "ReturnsBeforeWaiting", "stragglers and matmul_all_reduce", VALUES, MUST, CONTRACT),
    Proof("test_ops", "AliasReturnsBeforeWaiting", "stragglers and matmul_all_reduce", VALUES, MUST, CONTRACT),
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
    # pieces that are no shards of one tensor fail the check that assembles them, never the suite (issue 50)
    Proof("test_ops", "ScatterPiecesOfTwoShapes", "op_matches_golden and matmul_reduce_scatter and tp2 and not wT",
          NUMERICS, MUST, CONTRACT),
    Proof("test_ops", "ReplicasRoundDifferently", "op_matches_golden and matmul_all_reduce and float32 and tp2 "
          "and not wT", "replicated results bitwise identical", SHOULD, NUMERIC, must_hold=True),
    # fused ops in the corners of the case space (each passes the regular corner)
    Proof("test_ops", "UnwrittenColumnTail", "corner_n_not_multiple_of_8 and all_gather_matmul and not v2", NUMERICS,
          MUST, NUMERIC),
    Proof("test_ops", "LargeGatherDropsLastBlock", "corner_large_gather and all_gather_matmul and not v2", NUMERICS,
          MUST, NUMERIC),
    Proof("test_ops", "RawPointerWeight", "corner_strided_operands and matmul_all_reduce", r".*: numerics", MUST,
          NUMERIC),
    Proof("test_ops", "DoubleBufferedWorkspace", "corner_same_shape_calls and matmul_all_reduce", VALUES, MUST,
          CONTRACT),
    Proof("test_ops", "SharedWorkspaceBetweenOps", "corner_op_sequence and all_gather_matmul-then", VALUES, MUST,
          CONTRACT),
    Proof("test_ops", "Group128MisIndexed", "corner_w8a16_group_size", "test_corner_w8a16_group_size", MUST,
          NUMERIC),
    Proof("test_ops", "RaisesOnOneRankAfterReducing", "op_matches_golden and matmul_all_reduce and tp2 and not wT",
          "the op ran on every rank", MUST, ERROR),
    # a verdict once seen is never lost: a failure before refusals stands; one op of a sequence absent, the other
    # is judged; a check that compared nothing is not judged, never passed
    Proof("test_ops", "OneRowWrongOddRowsNotImplemented", "uneven_token_counts and matmul_all_reduce and tp2",
          r".*: numerics", MUST, NUMERIC),
    Proof("test_ops", "NoGatherZeroScatter", "corner_op_sequence and all_gather_matmul-then", NUMERICS, MUST, NUMERIC),
    # a wrong result beside a refusal in one case is judged: the refusal is not offered, the result fails (issue 50)
    Proof("test_ops", "WrongDefaultTilingRefusesBlocks", "exact_layout and matmul_reduce_scatter and float32 and tp2",
          "exact layout", MUST, NUMERIC),
    Proof("test_ops", "WrongDefaultTilingRefusesBlocks", "deterministic and matmul_all_reduce and float32 and tp4",
          NUMERICS, MUST, NUMERIC),
    Proof("test_ops", "ReturnsOnAnotherDevice", "op_matches_golden and matmul_all_reduce and tp2 and not wT",
          "replicated results bitwise identical", SHOULD, outcome="not judged"),
    Proof("test_ops", "DropsScatterRemainder", "uneven_token_counts and matmul_reduce_scatter and tp2",
          r"m=\d+ \(not a multiple of tp\): refused", MUST, ERROR),
    Proof("test_ops", "TruncatesLongScale", "w8a16_bad_arguments and scale-shape", "refused, naming the argument",
          MUST, ERROR),
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
    Proof("test_layers", "AliasAsyncButBlocking", "layer_matches_golden and row-nosp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, OVERLAP),
    # shapes that coincide: at TP 2 a rank's output block of the column part has the weight's shape
    Proof("test_layers", "SerialGatherDeclaredOverlapsOutput",
          "layer_matches_golden and mlp-sp-s64b1-h32x32-ffn64 and tp2-p2", "overlap structure", STRUCTURE, OVERLAP),
    Proof("test_layers", "WritesIntoItsInput", "layer_matches_golden and row-nosp and float32 and tp2-p2", VALUES,
          MUST, CONTRACT),
    Proof("test_layers", "DeclaresNoOverlap", "layer_matches_golden and row-nosp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, outcome="not judged"),
    Proof("test_layers", "IgnoresRecomputeAllGather", "saved_all_gather and column and tp2",
          "recompute_all_gather=False honoured", SHOULD, ERROR, must_hold=True),
    Proof("test_layers", "RefusesUnevenTokensVaguely", "uneven_token_counts and row-nosp and tp2",
          r".*: the refusal names m and p", SHOULD, ERROR, must_hold=True),
    Proof("test_layers", "FallsBackSilently", "uneven_token_counts and row-nosp and tp2",
          r".*: one fallback warning per layer", SHOULD, ERROR, must_hold=True),
    # work on a thread the probes cannot follow leaves its phase not judged, never the others (issue 50), and
    # a check reading collectives never passes on an incomplete timeline
    Proof("test_layers", "SerialBackwardBesideAHelperMatmul",
          "layer_matches_golden and mlp-sp and float32 and tp2-p2", "overlap structure", STRUCTURE, OVERLAP),
    Proof("test_layers", "RegathersOnAHelperThread", "saved_all_gather and column and tp2",
          "recompute_all_gather=False honoured", SHOULD, outcome="not judged", must_hold=True),
    # a callback registered before the recording, run during it: watched when it runs (issue 50), so the phase
    # it multiplies in is not judged on an incomplete timeline
    Proof("test_layers", "CallbackFromBeforeTheRecording", "layer_matches_golden and row-nosp and float32 and tp2-p2",
          "overlap structure", STRUCTURE, outcome="not judged", must_hold=True),
    # training steps
    Proof("test_training", "WrongGroupLayers", "layers_on_tp_subgroup and row-nosp and world4", NUMERICS, MUST,
          NUMERIC),
    Proof("test_training", "StaleWeightCache", "training_steps and row-nosp and tp2", NUMERICS, MUST, NUMERIC),
    Proof("test_training", "ReusedOutputWorkspace", "training_steps and row-nosp and tp2", VALUES, MUST, CONTRACT),
    Proof("test_training", "LostGradAccumulation", "gradient_accumulation_fusion and column-nosp and tp2", NUMERICS,
          MUST, NUMERIC),
    Proof("test_training", "GradInBothPlaces", "gradient_accumulation_fusion and row-nosp and tp2",
          "gradient lands in main_grad once", MUST, NUMERIC),
    Proof("test_training", "TP1RowDropsBias", "corner_tp1_layers and row-nosp", NUMERICS, MUST, NUMERIC),
    Proof("test_training", "WrongLongMicroBatchRefusesShortOne", "training_steps and row-nosp and tp2", NUMERICS, MUST,
          NUMERIC),
    Proof("test_training", "RowLayerTypeError", "training_steps and row-nosp and tp2",
          "the patched layers ran on every rank", MUST, ERROR),
    Proof("test_training", "AutocastOutputInInputDtype", "corner_autocast and row-sp", NUMERICS, MUST, NUMERIC),
    Proof("test_training", "UnfusedWeightGrad", "gradient_accumulation_fusion and row-nosp and tp2",
          "fusion honoured: gradient accumulated into main_grad", SHOULD, ERROR, must_hold=True),
    # a per-thread workspace of the backward, stale on a device's one long-lived backward thread (issue 50: a fresh
    # thread per backward passed it); keyed by the weight's version it is correct (test_suite_bites.CORRECT_VARIANTS)
    Proof("test_training", "StaleBackwardThreadWorkspace", "training_steps and column-nosp and tp2", NUMERICS, MUST,
          NUMERIC),
    # misuses of torch_npu's MC2 kernels, on the emulated NPU node (golden cases inside the kernels' domain)
    Proof("test_ops", "BiasIntoAllReduceKernel", "op_matches_golden and m64k512n64 and tp2 and not wT", NUMERICS,
          MUST, NUMERIC, says="the bias added on each of the 2 ranks before the reduction", node="npu-sim"),
    Proof("test_ops", "TransposeFlagLost", "op_matches_golden and m64k512n64 and tp2-wT", NUMERICS, MUST, NUMERIC,
          says=r"the weight's \[n, k\] storage read as an ND \[k, n\] matrix", node="npu-sim"),
    Proof("test_ops", "SecondMc2Domain", "op_matches_golden and m64k512n64 and tp2", "the op ran on every rank", MUST,
          ERROR, says="raised Mc2Refused: .* only one communication domain", node="npu-sim"),
]


#: (suite module, check name template) -> why no fault proves it.  ``{}`` stands for a formatted value.
UNPROVEN: dict[tuple[str, str], str] = {
    ("test_explore", "the exploration judged a case"):
        "never failed, only recorded as not judged when no drawn case was judged (OffersNoOp, in "
        "tests/unit/test_explore_kinds.py)",
    ("test_config", "test_user_cfgs_defaults"): "SHOULD of documented defaults: a fault would only restate them",
    ("test_config", "a clear refusal, or correct results"):
        "AcceptsMoE proves the refusal SHOULD with this MUST left unfailed; a clear refusal is proven by the "
        "other refusal rows",
    ("test_layers", "replicated results bitwise identical"):
        "proven on the op path (ReplicasRoundDifferently); the layer copies come from the same assembly check",
    ("test_layers", "{}: refused clearly on every rank"):
        "the clear-refusal rule is proven on the op path (OpUnevenTypeError); the layer path shares it",
    ("test_layers", "{}: declared shape error"): "UntypedErrors proves the declared-error rule on configure",
    ("test_layers", "the patched layers ran on every rank"):
        "proven on the training path (RowLayerTypeError); the layer cases sort what raised by the same function "
        "(judge/layer_verdicts.sort_layer_attempts)",
    ("test_layers", "test_layer_is_deterministic"): "ArrivalOrderReduction proves determinism on the op path",
    ("test_layers", "test_fused_kernel_layers_match_golden"):
        "the fused layers' numbers are judged by the same check as the scripted ones (DropsLastChunk ...)",
    ("test_layers", "test_auto_chunk_count_matches_golden"): "the same numeric check as the golden layer cases",
    ("test_ops", "{}: results are values"): "the result contract is proven on golden calls (ReturnsWrongShape ...)",
    ("test_ops", "{}: declared {} error"): "UntypedErrors proves the declared-error rule on configure",
    ("test_ops", "declared error type"): "UntypedErrors proves the declared-error rule on configure",
    ("test_training", "replicated results bitwise identical"):
        "proven on the op path (ReplicasRoundDifferently); the layer copies come from the same assembly check",
    ("test_perf", "test_coc_gain_meets_profile"):
        "a gate is enforced only where a shipped profile matches with enforce: true; no CPU profile does "
        "(cpu-gloo: a shared 2-core machine is too noisy), so here the check comes out not judged whatever the "
        "implementation -- a slow fault would need a test-only enforced profile and perf cases in the smoke tier. "
        "Its verdict rule is unit-tested (test_perf_protocol: test_judge_enforces_only_on_matching_hardware)",
}


def _templates(node: ast.expr) -> list[str]:
    """A check name as written: a string, an f-string (fields as ``{}``), or either side of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)]
    if isinstance(node, ast.IfExp):
        return _templates(node.body) + _templates(node.orelse)
    return []


def _check_names(fn: ast.AST) -> list[str]:
    """The name templates of the ``verdicts.check`` / ``verdicts.not_judged`` calls in ``fn``."""
    return [name for call in ast.walk(fn) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr in ("check", "not_judged")
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "verdicts"
            for name in _templates(call.args[0])]


def _called(fn: ast.AST) -> list[str]:
    """The names of the functions ``fn`` calls by a plain name."""
    return [call.func.id for call in ast.walk(fn) if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)]


def _shared_judging() -> dict[str, list[str]]:
    """Judging sequences of ``conformance/judge/*_verdicts.py`` a suite test calls by name -> their checks' names,
    those of the sequences they call in turn included."""
    functions = {fn.name: fn for path in sorted((SUITE.parent / "judge").glob("*_verdicts.py"))
                 for fn in ast.parse(path.read_text()).body if isinstance(fn, ast.FunctionDef)}

    def names(name: str, seen: frozenset[str] = frozenset()) -> list[str]:
        fn = functions[name]
        inner = [n for callee in _called(fn) if callee in functions and callee not in seen | {name}
                 for n in names(callee, seen | {name})]
        return _check_names(fn) + inner

    return {name: list(dict.fromkeys(names(name))) for name in functions}


def suite_checks(suite: Path = SUITE) -> Iterator[tuple[str, str]]:
    """``(module, name template)`` of every named check of the suite, in file order (shared sequences included)."""
    shared = _shared_judging()
    for path in sorted(suite.glob("test_*.py")):
        seen: set[str] = set()
        for fn in ast.parse(path.read_text()).body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            names = _check_names(fn)
            names += [name for callee in _called(fn) for name in shared.get(callee, ())]
            if fn.name.startswith("test_") and "verdicts" not in {a.arg for a in fn.args.args}:
                names.append(fn.name)
            for name in names:
                if name not in seen:
                    seen.add(name)
                    yield path.stem, name


def proofs_of(module: str, template: str) -> list[Proof]:
    """The rows proving a check (its ``{}`` fields read as a number)."""
    sample = template.replace("{}", "1")
    return [p for p in FAULT_TABLE if p.module == module and re.fullmatch(p.check, sample)]


def main() -> int:
    checks = list(suite_checks())
    for module, name in checks:
        proofs = proofs_of(module, name)
        proven = ", ".join(f"{p.fault} ({p.level} {p.outcome})" for p in proofs)
        print(f"{module:<14} {name:<55} {proven or 'UNPROVEN: ' + UNPROVEN.get((module, name), '(no reason)')}")
    unproven = [check for check in checks if not proofs_of(*check)]
    print(f"{len(checks)} checks: {len(checks) - len(unproven)} proven by {len(FAULT_TABLE)} faults, "
          f"{len(unproven)} unproven ({sum(check not in UNPROVEN for check in unproven)} without a reason)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
