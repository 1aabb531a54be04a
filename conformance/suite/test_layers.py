"""Layer conformance (SPEC §1, §3, §6): the patched Megatron layers, forward and backward.

For every golden layer case (column, row, column -> gelu -> row; SP on and
off; fp32 / bf16 / fp16), every TP size and every chunk count, the patched
layers' output, input grad, weight grads and bias grads must lie within the
principled bound of the float64 golden (with the live unpatched layers as the
serial reference), ranks holding replicated tensors must agree bitwise, and
the collectives overlapped with the matmul must really be chunked as
configured and issued asynchronously.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import golden
from conformance import checks, numerics
from conformance.cases.layer_cases import layer_case, shape_rule_case
from conformance.errors import CheckFailure, WrongError
from conformance.layouts import assemble, layout

pytestmark = pytest.mark.coc_requires("patch_megatron")

TP_SIZES = (2, 4, 8)
CHUNKS = (1, 2, 4, 8)
LAYER_CASES = [c.id for c in golden.catalogue("layer")]
#: Backends whose collectives are deterministic run to run.
DETERMINISTIC_LAUNCHERS = ("process", "threaded")

#: The collective each layer overlaps with its matmul, per SP mode and phase (SPEC §1).
OVERLAPPED: dict[tuple[str, bool], dict[str, str]] = {
    ("column", False): {"backward": "all_reduce"},
    ("column", True): {"forward": "all_gather", "backward": "reduce_scatter"},
    ("row", False): {"forward": "all_reduce"},
    ("row", True): {"forward": "reduce_scatter", "backward": "all_gather"},
}


def _envelopes(g: Any) -> dict[str, tuple[Any, int]]:
    i = g.inputs
    if g.params["layer"] == "mlp":
        return numerics.mlp_envelope(i["x"], i["w1"], i.get("b1"), i["w2"], i.get("b2"), i["dy"])
    return numerics.linear_envelope(i["x"], i["w"], i.get("b"), i["dy"])


def _expected_collectives(layer: str, sp: bool, chunks: int) -> dict[str, dict[str, int]]:
    """Phase -> {collective kind: count} the patched layers must issue."""
    parts = ["column", "row"] if layer == "mlp" else [layer]
    expected: dict[str, dict[str, int]] = {"forward": {}, "backward": {}}
    for part in parts:
        for phase, kind in OVERLAPPED[(part, sp)].items():
            expected[phase][kind] = expected[phase].get(kind, 0) + chunks
    if layer == "mlp" and sp:
        # The column backward may also all-gather x again (recompute_all_gather).
        expected["backward"].pop("all_gather")
    return expected


def check_collectives(observed: Mapping[str, Sequence[tuple[str, bool]]], layer: str, sp: bool,
                      chunks: int) -> None:
    for phase, kinds in _expected_collectives(layer, sp, chunks).items():
        calls = observed[phase]
        for kind, count in kinds.items():
            issued = [overlappable for k, overlappable in calls if k == kind]
            if len(issued) != count:
                raise CheckFailure(
                    f"{phase}: expected {count} chunked {kind} collective(s) for {chunks} chunk(s), "
                    f"the patched layer issued {len(issued)} (all collectives: {calls})")
            if chunks > 1 and not all(issued):
                raise CheckFailure(f"{phase}: chunked {kind} issued synchronously; nothing can "
                                   f"overlap (collectives: {calls})")


def _supports(g: Any, tp: int, chunks: int) -> bool:
    m = g.params["s"] * g.params["b"]
    rows = m // tp if g.params["sequence_parallel"] else m
    return m % tp == 0 and rows % chunks == 0


def roundings(tp: int, chunks: int, layer: str) -> int:
    """R of the bound: TP partials, chunked weight-grad sums, bias and cast, per linear layer."""
    return (tp + chunks + 2) * (2 if layer == "mlp" else 1)


def _check_results(g: Any, results: Sequence[Mapping[str, Any]], chunks: int, run: int = 0) -> None:
    """CoC pieces of every rank against the float64 golden, with the serial bound."""
    splits = layout(g.params["layer"], g.params["sequence_parallel"])
    envelopes = _envelopes(g)
    for name, truth in g.outputs.items():
        serial = assemble([r["serial"][name] for r in results], splits[name], f"serial {name}")
        coc = assemble([r["coc"][run][name] for r in results], splits[name], f"CoC {name}")
        checks.check_close(name, coc, truth, serial, envelopes[name], g.dtype,
                           roundings=roundings(len(results), chunks, g.params["layer"]))


def _params() -> list[Any]:
    params = []
    for case_id in LAYER_CASES:
        g = golden.load(case_id)
        for tp in TP_SIZES:
            for chunks in CHUNKS:
                if _supports(g, tp, chunks):
                    params.append(pytest.param(case_id, tp, chunks, id=f"{case_id}-tp{tp}-p{chunks}"))
    return params


@pytest.mark.parametrize("case_id, tp, chunks", _params())
def test_layer_matches_golden(coc_ranks: Any, case_id: str, tp: int, chunks: int) -> None:
    g = golden.load(case_id)
    results = coc_ranks.run(layer_case, tp, case_id=case_id, chunks=chunks)
    _check_results(g, results, chunks)
    for rank, result in enumerate(results):
        try:
            check_collectives(result["coc"][0]["collectives"], g.params["layer"],
                              g.params["sequence_parallel"], chunks)
        except CheckFailure as failure:
            raise type(failure)(f"rank {rank}: {failure}") from None


def _sp_cases(layers: tuple[str, ...] = ("column", "mlp")) -> list[str]:
    return [c for c in LAYER_CASES if golden.load(c).params["sequence_parallel"]
            and golden.load(c).params["layer"] in layers]


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", _sp_cases())
def test_saved_all_gather_matches_golden(coc_ranks: Any, case_id: str, tp: int) -> None:
    """``recompute_all_gather=False`` saves the gathered input: same numbers, no backward gather."""
    g = golden.load(case_id)
    results = coc_ranks.run(layer_case, tp, case_id=case_id, chunks=2,
                            coc_cfgs={"recompute_all_gather": False})
    _check_results(g, results, 2)
    if g.params["layer"] == "column":
        for result in results:
            gathers = [k for k, _ in result["coc"][0]["collectives"]["backward"] if k == "all_gather"]
            if gathers:
                raise CheckFailure("recompute_all_gather=False, yet the column backward all-gathered "
                                   f"its input again ({len(gathers)} all-gather(s))")


@pytest.mark.parametrize("case_id", [c for c in LAYER_CASES if "float32" in c or "bfloat16" in c])
def test_layer_is_deterministic(coc_ranks: Any, pytestconfig: pytest.Config, case_id: str) -> None:
    launcher = pytestconfig.getoption("--coc-launcher")
    if launcher not in DETERMINISTIC_LAUNCHERS:
        pytest.skip(f"collectives of the {launcher} launcher's backend are not bitwise reproducible")
    results = coc_ranks.run(layer_case, 4, case_id=case_id, chunks=4, runs=3, serial=False)
    for rank, result in enumerate(results):
        runs = [{k: v for k, v in run.items() if k != "collectives"} for run in result["coc"]]
        checks.check_bitwise_equal(f"{case_id} rank {rank}", runs)


def _layer_shapes(g: Any) -> tuple[int, int, int]:
    p = g.params
    return p["s"] * p["b"], p["h_in"], p["h_out"]


@pytest.mark.parametrize("base, custom", [(2, 1), (2, 4), (1, 4)], ids=["p2-custom1", "p2-custom4",
                                                                      "p1-custom4"])
@pytest.mark.parametrize("case_id", [c for c in LAYER_CASES if "float32" in c and "mlp" not in c])
def test_customized_coc_is_honoured(coc_ranks: Any, case_id: str, base: int, custom: int) -> None:
    """``customized_coc`` overrides ``parallel_num`` for its matmul shapes, in every layer and mode.

    Keys are ``[m, k, n]`` of each matmul on one rank, ``m`` the full token
    count (after the SP all-gather, before the SP reduce-scatter): the forward
    ``x @ W.T`` is ``[m, in, out]`` and the input-grad ``dy @ W`` is
    ``[m, out, in]``, with this rank's shard of the sharded dimension.
    """
    g = golden.load(case_id)
    tp = 2
    m, h_in, h_out = _layer_shapes(g)
    k, n = (h_in, h_out // tp) if g.params["layer"] == "column" else (h_in // tp, h_out)
    customized = {f"[{m}, {k}, {n}]": custom, f"[{m}, {n}, {k}]": custom}
    results = coc_ranks.run(layer_case, tp, case_id=case_id, chunks=base,
                            coc_cfgs={"customized_coc": customized})
    _check_results(g, results, max(custom, base))
    for result in results:
        check_collectives(result["coc"][0]["collectives"], g.params["layer"],
                          g.params["sequence_parallel"], custom)


SHAPE_ERRORS = [
    # layer, sp, s, b, chunks, tp: m % p != 0, or per-rank rows % p != 0 under SP
    pytest.param("row", False, 6, 2, 8, 2, id="row-nosp-m12-p8"),
    pytest.param("column", False, 6, 2, 8, 2, id="column-nosp-m12-p8"),
    pytest.param("column", True, 12, 2, 4, 4, id="column-sp-rows6-p4"),
    pytest.param("row", True, 10, 2, 4, 2, id="row-sp-rows10-p4"),
]


@pytest.mark.parametrize("layer, sp, s, b, chunks, tp", SHAPE_ERRORS)
def test_unsplittable_tokens_raise_shape_error_on_every_rank(
    coc_ranks: Any, layer: str, sp: bool, s: int, b: int, chunks: int, tp: int,
) -> None:
    results = coc_ranks.run(shape_rule_case, tp, layer=layer, sp=sp, s=s, b=b, h=8, chunks=chunks)
    m = s * b
    checks.check_error_on_every_rank(
        results, type_name="CoCShapeError",
        patterns=[rf"\b{m}\b", rf"\b{chunks}\b", r"\btp\b", layer])


@pytest.mark.parametrize("layer, sp", [("column", False), ("row", False), ("row", True)])
def test_fewer_tokens_than_chunks_falls_back_with_one_warning(coc_ranks: Any, layer: str, sp: bool) -> None:
    tp, chunks = 2, 8
    s, b = (2, 2) if sp else (2, 1)  # m = 4 (SP) or 2 tokens < 8 chunks
    results = coc_ranks.run(shape_rule_case, tp, layer=layer, sp=sp, s=s, b=b, h=8, chunks=chunks)
    for rank, result in enumerate(results):
        if result["error"] is not None:
            raise WrongError(f"rank {rank} raised instead of falling back: {result['error']}")
        fallback = [w for w in result["warnings"] if "chunk" in w.lower()]
        if len(fallback) != 1:
            raise WrongError(f"rank {rank}: expected one fallback warning, got {result['warnings']}")
        if not _close(result["y"], result["serial"]):
            raise CheckFailure(f"rank {rank}: the fallback output differs from the serial layer")


def _close(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6))


@pytest.mark.parametrize("tp", [8], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", [c for c in LAYER_CASES if "float32" in c or "bfloat16" in c])
def test_fused_kernel_layers_match_golden(coc_impl: Any, coc_ranks: Any, case_id: str, tp: int) -> None:
    """``--coc-fused-kernel`` (TP 8 only) patches the layers within the golden bound.

    An implementation without fused layers refuses the flag with a
    CoCBackendUnavailable-like error: the case is skipped saying so.
    """
    argv = ["--use-ascend-coc", "--coc-fused-kernel"]
    try:
        coc_impl.configure(argv, {}, tp_size=tp)
    except Exception as exc:
        if "CoCBackendUnavailable" not in [c.__name__ for c in type(exc).__mro__]:
            raise
        pytest.skip(f"{coc_impl.name} has no fused-kernel layers: {exc}")
    g = golden.load(case_id)
    results = coc_ranks.run(layer_case, tp, case_id=case_id, chunks=8, argv=argv)
    _check_results(g, results, chunks=8)


@pytest.mark.parametrize("tp", [2], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("case_id", [c for c in LAYER_CASES if "float32" in c])
def test_auto_chunk_count_matches_golden(coc_ranks: Any, case_id: str, tp: int) -> None:
    """``--coc-parallel-num auto``: whatever count the implementation picks, the numbers hold."""
    g = golden.load(case_id)
    results = coc_ranks.run(layer_case, tp, case_id=case_id, chunks="auto")
    _check_results(g, results, 8)
