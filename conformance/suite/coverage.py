"""No silent holes: every op x dtype x TP size x layout x mode of the catalogue has a case.

A parametrisation that silently drops combinations (an empty filter, a wrong
divisibility test) would let a bug hide in a case that never runs.  At
collection the suite computes what its cases cover and fails the session,
naming the holes, when a required combination is missing
(``conformance/suite/conftest.py``).  Only tests collected in full are checked:
a run narrowed by node id or ``--coc-tp`` has holes on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import product
from typing import Any

from conformance.cases.groups import GROUP_LAYOUTS, SUBGROUP_SIZES
from conformance.contract.jobs import OPERAND_STRIDES
from conformance.contract.problems import LAYER_KINDS
from conformance.protocol import DETERMINISTIC_OPS, FUSED_OPS
from golden.catalogue import DTYPES, TP_SIZES

SP = (False, True)
#: Corners of the case space every fused op is run in.
CORNERS_OF_EVERY_OP = ("test_corner_n_not_multiple_of_8", "test_corner_large_gather", "test_corner_tp1",
                       "test_corner_same_shape_calls")

Key = tuple[Any, ...]


def _golden(case_id: str) -> Mapping[str, Any]:
    import golden

    return next(c for c in golden.catalogue() if c.id == case_id).params


def required() -> dict[str, set[Key]]:
    """Per test function, the combinations its cases must cover."""
    return {
        "test_op_matches_golden": set(product(FUSED_OPS, DTYPES, TP_SIZES, (False, True))),
        "test_deterministic_is_bitwise_reproducible": set(product(DETERMINISTIC_OPS, DTYPES, (3, 4))),
        "test_w8a16_matches_dequantised_golden": set(product(("float16", "bfloat16"), TP_SIZES)),
        "test_exact_layout": set(product(FUSED_OPS, DTYPES, (2, 8))),
        "test_results_are_values": set(product(FUSED_OPS, (2, 8))),
        "test_tp_subgroup_of_the_world": {(op, w, t, lay) for op in FUSED_OPS for w, t in SUBGROUP_SIZES
                                          for lay in GROUP_LAYOUTS},
        "test_stragglers": set(product(FUSED_OPS, ("rank1", "random"))),
        "test_layer_matches_golden": set(product(LAYER_KINDS, SP, DTYPES, TP_SIZES)),
        "test_layer_matches_golden/chunks": set(product(LAYER_KINDS, SP, (1, 2, 4, 8))),
        "test_training_steps": set(product(LAYER_KINDS, SP, (2, 8))),
        "test_gradient_accumulation_fusion": set(product(LAYER_KINDS, SP, (2, 8))),
        "test_layers_on_tp_subgroup": {(lay, sp, w, t) for lay in LAYER_KINDS for sp in SP for w, t in SUBGROUP_SIZES},
        "test_layer_stragglers": set(product(LAYER_KINDS, SP, ("rank1", "random"))),
        **{name: {(op,) for op in FUSED_OPS} for name in CORNERS_OF_EVERY_OP},
        "test_corner_strided_operands": set(product(FUSED_OPS, OPERAND_STRIDES[1:])),
        "test_corner_tp1_layers": {(layer,) for layer in LAYER_KINDS},
    }


def keys(name: str, params: Mapping[str, Any]) -> dict[str, Key]:
    """What one case covers, per requirement it counts for (none for tests without requirements)."""
    p = dict(params)
    if "case_id" in p and p["case_id"].startswith(("op-", "layer-", "w8a16-")):
        g = _golden(p["case_id"])
        p.setdefault("dtype", g["dtype"])
        if "layer" in g:
            p.setdefault("layer", g["layer"])
            p.setdefault("sp", g["sequence_parallel"])
    found: dict[str, Key] = {}
    if name == "test_op_matches_golden":
        found[name] = (p["op"], p["dtype"], p["tp"], p["transpose"])
    elif name == "test_deterministic_is_bitwise_reproducible":
        found[name] = (p["op"], p["dtype"], p["tp"])
    elif name == "test_w8a16_matches_dequantised_golden":
        found[name] = (p["dtype"], p["tp"])
    elif name == "test_exact_layout":
        found[name] = (p["op"], p["dtype"], p["tp"])
    elif name == "test_results_are_values":
        found[name] = (p["op"], p["tp"])
    elif name == "test_tp_subgroup_of_the_world":
        found[name] = (p["op"], p["world"], p["tp"], p["layout"])
    elif name == "test_stragglers":
        found[name] = (p["op"], p["who"])
    elif name == "test_layer_matches_golden":
        found[name] = (p["layer"], p["sp"], p["dtype"], p["tp"])
        found[f"{name}/chunks"] = (p["layer"], p["sp"], p["chunks"])
    elif name in ("test_training_steps", "test_gradient_accumulation_fusion"):
        found[name] = (p["layer"], p["sp"], p["tp"])
    elif name == "test_layers_on_tp_subgroup":
        found[name] = (p["layer"], p["sp"], p["world"], p["tp"])
    elif name == "test_layer_stragglers":
        found[name] = (p["layer"], p["sp"], p["who"])
    elif name in CORNERS_OF_EVERY_OP:
        found[name] = (p["op"],)
    elif name == "test_corner_strided_operands":
        found[name] = (p["op"], p["strides"])
    elif name == "test_corner_tp1_layers":
        found[name] = (p["layer"],)
    return found


def holes(cases: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, list[Key]]:
    """Missing combinations of every requirement whose test function has at least one case."""
    covered: dict[str, set[Key]] = {}
    for name, params in cases:
        for requirement, key in keys(name, params).items():
            covered.setdefault(requirement, set()).add(key)
    wanted = required()
    return {r: sorted(wanted[r] - covered[r], key=str) for r in covered if r in wanted and wanted[r] - covered[r]}
