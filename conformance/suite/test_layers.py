"""Layer conformance (``docs/DESIGN.md#layouts``): the patched Megatron layers, forward and backward.

For every golden layer case (column, row, column -> gelu -> row; SP on and
off; fp32 / bf16 / fp16), every TP size and every chunk count:

* MUST: the patched layers' output, input grad, weight grads and bias grads
  lie within the error bound of the float64 golden (the live unpatched layers
  are the serial reference), every rank's copy of a replicated one too;
  results are values;
* SHOULD: ranks holding a replicated tensor hold it bitwise identically;
* STRUCTURE: each layer phase overlaps its collective the way the
  implementation declares (``docs/DESIGN.md#overlap-structure``).

Token counts no chunking divides (odd, prime, smaller than the chunk count, 1)
get correct numbers or a clear refusal on every rank (MUST), never silent
wrong rows: fresh allocations are poisoned while the implementation runs.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import golden
from conformance import options
from conformance.cases.layer_cases import layer_task
from conformance.contract.jobs import LayerJob, coc_argv
from conformance.contract.problems import LayerProblem
from conformance.contract.results import LayerOutcome
from conformance.harness.impl_loader import accepts_keyword
from conformance.judge import checks, structure
from conformance.judge import layers as judge
from conformance.judge.determinism import arrival_ordered
from conformance.judge.layer_truth import golden_problem
from conformance.judge.layer_verdicts import (
    judge_layer_refusal,
    judge_layer_results,
    judge_numerics,
    layer_refusal_names,
    layers_ran,
    sort_layer_attempts,
)
from conformance.launching import rank_backend
from conformance.protocol import PHASE_COLLECTIVES, Chunked, Declarations, NotOverlapped, OverlapsMatmul
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import WrongError
from conformance.record.levels import Level
from conformance.record.verdicts import NotJudged, NotOffered
from golden.catalogue import TP_SIZES

pytestmark = [pytest.mark.coc_requires("patch_megatron"), pytest.mark.coc_kind("layer")]

CHUNKS = (1, 2, 4, 8)
LAYER_CASES = golden.catalogue("layer")
#: Launchers whose collectives are deterministic run to run.
DETERMINISTIC_LAUNCHERS = ("process", "threaded")


def _cases(**wanted: Any) -> list[str]:
    """Golden layer case ids whose catalogue parameters have the ``wanted`` values."""
    return [c.id for c in LAYER_CASES if all(
        c.params[k] in v if isinstance(v, tuple) else c.params[k] == v for k, v in wanted.items())]


def _supports(case_id: str, tp: int, chunks: int) -> bool:
    p = next(c for c in LAYER_CASES if c.id == case_id).params
    m = p["s"] * p["b"]
    rows = m // tp if p["sequence_parallel"] else m
    return m % tp == 0 and rows % chunks == 0


def _layer_params() -> list[Any]:
    return [pytest.param(case_id, tp, chunks, id=f"{case_id}-tp{tp}-p{chunks}")
            for case_id in _cases() for tp in TP_SIZES for chunks in CHUNKS if _supports(case_id, tp, chunks)]


def _run(coc_ranks: Any, job: LayerJob, verdicts: Any = None) -> list[LayerOutcome]:
    """The job on its ranks: what raised sorted by the one rule (``sort_layer_attempts``; a test without
    ``verdicts`` judges by its own assertions: ``layers_ran``), what came back left to the test's checks."""
    outcomes = coc_ranks.run(layer_task, job.tp, job=job)
    what = f"{job.problem.layer} layer, argv {list(job.argv)}"
    if verdicts is None:
        layers_ran(outcomes, what)
    else:
        sort_layer_attempts(verdicts, outcomes, what=what)
    return outcomes


@pytest.mark.parametrize("case_id, tp, chunks", _layer_params())
def test_layer_matches_golden(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, case_id: str, tp: int,
                              chunks: int) -> None:
    problem = golden_problem(case_id)
    job = LayerJob(problem, tp, tuple(coc_argv(chunks)))
    outcomes = _run(coc_ranks, job, verdicts)
    judge_layer_results(verdicts, job, outcomes, chunks=chunks)
    if chunks > 1:
        with verdicts.check("overlap structure", Level.STRUCTURE):
            structure.check_layer_structure(problem, outcomes, coc_declarations.overlap, chunks=chunks, tp=tp)


def _needs_coc_cfgs(coc_impl: Any) -> None:
    if not accepts_keyword(coc_impl.configure, "coc_cfgs"):
        raise NotOffered(f"{coc_impl.name}.configure takes no coc_cfgs (protocol v1)")


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", _cases(sequence_parallel=True, layer=("column", "mlp")))
def test_saved_all_gather_matches_golden(coc_ranks: Any, coc_impl: Any, verdicts: Any, case_id: str,
                                         tp: int) -> None:
    """``recompute_all_gather=False`` saves the gathered input: same numbers, no backward re-gather."""
    _needs_coc_cfgs(coc_impl)
    problem = golden_problem(case_id)
    job = LayerJob(problem, tp, tuple(coc_argv(2)), coc_cfgs={"recompute_all_gather": False})
    outcomes = _run(coc_ranks, job, verdicts)
    judge_numerics(verdicts, job, outcomes, chunks=2)
    with verdicts.check("recompute_all_gather=False honoured", Level.SHOULD):
        judge.check_saved_gather(outcomes)


@pytest.mark.coc_level("SHOULD")
@pytest.mark.parametrize("tp", [4], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", _cases(dtype=("float32", "bfloat16")))
def test_layer_is_deterministic(coc_ranks: Any, pytestconfig: pytest.Config, case_id: str, tp: int) -> None:
    launcher = pytestconfig.getoption(options.LAUNCHER)
    if launcher not in DETERMINISTIC_LAUNCHERS:
        pytest.skip(f"collectives of the {launcher} launcher's backend are not bitwise reproducible")
    backend_order = arrival_ordered(rank_backend(pytestconfig), os.environ)
    if backend_order:  # a layer's default mode promises no determinism of its own: nothing to judge there
        raise NotJudged(backend_order)
    problem = golden_problem(case_id)
    outcomes = _run(coc_ranks, LayerJob(problem, tp, tuple(coc_argv(4)), runs=3, serial=False))
    for rank, outcome in enumerate(outcomes):
        runs = [[(s.outputs, s.grads) for s in steps] for steps in outcome.coc]
        checks.check_bitwise_equal(f"{case_id} rank {rank}", runs)


@pytest.mark.parametrize("tp", [2], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("base, custom", [(2, 1), (2, 4), (1, 4)], ids=["p2-custom1", "p2-custom4", "p1-custom4"])
@pytest.mark.parametrize("case_id", _cases(dtype="float32", layer=("column", "row")))
def test_customized_coc_is_honoured(coc_ranks: Any, coc_impl: Any, verdicts: Any, coc_declarations: Declarations,
                                    case_id: str, base: int, custom: int, tp: int) -> None:
    """``customized_coc`` overrides ``parallel_num`` for its matmul shapes, in every layer and mode.

    Keys are ``[m, k, n]`` of each matmul on one rank, ``m`` the full token
    count (after the SP all-gather, before the SP reduce-scatter): the forward
    ``x @ W.T`` is ``[m, in, out]`` and the input-grad ``dy @ W`` is
    ``[m, out, in]``, with this rank's shard of the sharded dimension.
    """
    _needs_coc_cfgs(coc_impl)
    problem = golden_problem(case_id)
    m = problem.tokens[0] * problem.b
    k, n = (problem.h_in, problem.h_out // tp) if problem.layer == "column" else (problem.h_in // tp, problem.h_out)
    customized = {f"[{m}, {k}, {n}]": custom, f"[{m}, {n}, {k}]": custom}
    job = LayerJob(problem, tp, tuple(coc_argv(base)), coc_cfgs={"customized_coc": customized})
    outcomes = _run(coc_ranks, job, verdicts)
    judge_numerics(verdicts, job, outcomes, chunks=max(custom, base))
    # Only chunked (or undeclared) phases have a chunk count to change; the others are not judged.
    phases = {key: NotOverlapped() if isinstance(s, OverlapsMatmul) else s
              for key, s in coc_declarations.overlap.items()}
    phases.update({key: Chunked() for key in PHASE_COLLECTIVES if key not in coc_declarations.overlap})
    with verdicts.check("customized_coc honoured in every phase", Level.SHOULD):
        if not structure.may_chunk(coc_declarations.overlap, problem.layer, problem.sequence_parallel):
            raise NotJudged(f"{problem.layer}: no phase is declared chunked, so customized_coc has no chunk count "
                            "to change")
        structure.check_layer_structure(problem, outcomes, phases, chunks=custom, tp=tp)


#: (sequence length on each rank, batch, chunks) per SP mode: an odd prime, one token, fewer
#: tokens than chunks, rows no chunk count divides.
UNEVEN_TOKENS = {False: ((7, 1, 2), (1, 1, 4), (3, 2, 4), (13, 1, 8)),
                 True: ((6, 1, 4), (2, 1, 8), (10, 1, 4), (18, 1, 8))}


def _uneven_params() -> list[Any]:
    return [pytest.param(layer, sp, tp, id=f"{layer}-{'sp' if sp else 'nosp'}-tp{tp}")
            for layer in ("column", "row", "mlp") for sp in (False, True) for tp in (2, 8)]


@pytest.mark.parametrize("layer, sp, tp", _uneven_params())
def test_uneven_token_counts(coc_ranks: Any, verdicts: Any, coc_declarations: Declarations, layer: str, sp: bool,
                             tp: int) -> None:
    """Correct numbers or a clear refusal on every rank -- never silent wrong rows.

    With fewer tokens than chunks an implementation should fall back to one
    chunk and say so once (SHOULD); a refusal should be the declared shape
    error naming the token count and the chunk count (SHOULD).
    """
    for s, b, chunks in UNEVEN_TOKENS[sp]:
        s_total = s * tp if sp else s  # SP shards the sequence: every rank holds s (times b) tokens
        problem = LayerProblem(layer, sp, 16, 16, "float32", b=b, tokens=(s_total,),
                               ffn=32 if layer == "mlp" else None, seed=s * 10 + chunks)
        rows = s * b  # on each rank: all of them (no SP) or the rank's sequence shard (SP)
        m = s_total * b
        label = f"m={m} ({rows} rows per rank), {chunks} chunks"
        with verdicts.sub_case(label):
            outcomes = coc_ranks.run(layer_task, tp, job=LayerJob(problem, tp, tuple(coc_argv(chunks))))
            _judge_uneven(verdicts, coc_declarations, outcomes, problem, label=label, m=m, rows=rows, chunks=chunks,
                          tp=tp)


def _judge_uneven(verdicts: Any, declared: Declarations, outcomes: list[LayerOutcome], problem: LayerProblem, *,
                  label: str, m: int, rows: int, chunks: int, tp: int) -> None:
    """One token count of :func:`test_uneven_token_counts`: not offered, a refusal, or numbers and a fallback."""
    layer, sp = problem.layer, problem.sequence_parallel
    what = f"{layer} layer {label}"
    attempts = sort_layer_attempts(verdicts, outcomes, what=what, refusal_allowed=True)
    if attempts.raised:
        judge_layer_refusal(verdicts, outcomes, declared, label=label, what=what,
                            names=layer_refusal_names(m, rows, chunks, tp))
        with verdicts.check(f"{label}: the refusal names m and p", Level.SHOULD):
            checks.check_refused_on_every_rank(next(iter(attempts.raised.values())), what=f"{layer} layer {label}",
                                               patterns=[rf"\b({m}|{rows})\b", rf"\b{chunks}\b"],
                                               level=Level.SHOULD)
    if not attempts.returned:
        return
    with verdicts.check(f"{label}: numerics", Level.MUST):
        judge.check_training(problem, outcomes, tp=tp, chunks=chunks, evidence=verdicts.evidence)
    if rows < chunks:
        with verdicts.check(f"{label}: one fallback warning per layer", Level.SHOULD):
            expected = sum(structure.may_chunk(declared.overlap, part, sp) for part in structure.layer_parts(layer))
            if not expected:
                raise NotJudged(f"no phase of the {layer} layer is declared chunked: nothing falls back")
            for rank, outcome in enumerate(outcomes):
                fallback = [w for w in outcome.warnings if "chunk" in w.lower()]
                if len(fallback) != expected:
                    raise WrongError(f"rank {rank}: {label}: expected {expected} warning(s) that the layer runs "
                                     f"unchunked (one per layer call), got {list(outcome.warnings)}",
                                     level=Level.SHOULD)


def _fused_or_skip(coc_impl: Any, coc_declarations: Declarations, tp: int) -> tuple[str, ...]:
    from conformance.harness.captured_calls import call_capturing_errors

    if not coc_declarations.fused_layers:
        raise NotOffered(f"{coc_impl.name} declares no fused-kernel layers (fused_layers = False)")
    argv = ("--use-ascend-coc", "--coc-fused-kernel")
    _, error = call_capturing_errors(coc_impl.configure, list(argv), {}, tp_size=tp)
    unavailable = coc_declarations.error_type("backend_unavailable")
    # Undeclared: any class of that name (as the reference calls it) in the error's hierarchy.
    if error is not None and (error.is_a(*unavailable) if unavailable
                              else any(q.rsplit(".", 1)[-1] == "CoCBackendUnavailable" for q in error.mro)):
        pytest.skip(f"{coc_impl.name}: fused-kernel layers unavailable here: {error.message}")
    return argv


@pytest.mark.parametrize("tp", [8], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", _cases(dtype=("float32", "bfloat16")))
def test_fused_kernel_layers_match_golden(coc_impl: Any, coc_declarations: Declarations, coc_ranks: Any,
                                          case_evidence: CaseEvidence, case_id: str, tp: int) -> None:
    """``--coc-fused-kernel`` (TP 8 only) patches the layers within the golden bound."""
    argv = _fused_or_skip(coc_impl, coc_declarations, tp)
    problem = golden_problem(case_id)
    outcomes = _run(coc_ranks, LayerJob(problem, tp, argv))
    judge.check_training(problem, outcomes, tp=tp, chunks=8, evidence=case_evidence)


@pytest.mark.parametrize("tp", [8], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("layer, sp", [("column", False), ("column", True), ("row", False), ("row", True)],
                         ids=["column-nosp", "column-sp", "row-nosp", "row-sp"])
def test_fused_kernel_layers_overlap(coc_impl: Any, coc_declarations: Declarations, coc_ranks: Any, verdicts: Any,
                                     layer: str, sp: bool, tp: int) -> None:
    """The fused path really ran: every phase overlaps its collective (or a fused op ran), as declared.

    Run on a token count large enough for any tiling plan to split (2048 tokens, 256 per rank with SP).
    """
    argv = _fused_or_skip(coc_impl, coc_declarations, tp)
    problem = LayerProblem(layer, sp, 32, 32, "float32", tokens=(2048,), seed=2)
    job = LayerJob(problem, tp, argv)
    outcomes = _run(coc_ranks, job, verdicts)
    judge_numerics(verdicts, job, outcomes, chunks=8)
    with verdicts.check("the fused path overlaps", Level.STRUCTURE):
        structure.check_layer_structure(problem, outcomes, coc_declarations.fused_overlap, chunks=1, tp=tp, fused=True)


@pytest.mark.parametrize("tp", [2], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", _cases(dtype="float32"))
def test_auto_chunk_count_matches_golden(coc_ranks: Any, coc_impl: Any, case_evidence: CaseEvidence, case_id: str,
                                         tp: int) -> None:
    """``--coc-parallel-num auto``: whatever count the implementation picks, the numbers hold.

    Supporting ``auto`` at all is a SHOULD (judged by test_config's ``cli-auto``): an
    implementation that refuses it skips here.
    """
    from conformance.harness.captured_calls import call_capturing_errors

    _, refused = call_capturing_errors(coc_impl.configure, coc_argv("auto"), {}, tp_size=tp)
    if refused is not None:
        raise NotOffered(f"{coc_impl.name} refuses --coc-parallel-num auto ({refused.describe()}); supporting it "
                         "is a SHOULD, judged by test_config's cli-auto")
    problem = golden_problem(case_id)
    outcomes = _run(coc_ranks, LayerJob(problem, tp, tuple(coc_argv("auto"))))
    judge.check_training(problem, outcomes, tp=tp, chunks=8, evidence=case_evidence)
