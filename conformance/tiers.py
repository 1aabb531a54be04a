"""The smoke tier (``-m smoke``): the per-change CI stage, chosen by what it catches (``docs/DESIGN.md#tiers``).

Its cases are data, ``smoke_tier.json`` beside this module, written by
``python -m conformance.bench tiers`` (:mod:`conformance.bench.tier_choice`):
the cheapest set of the suite's cases that catches every fault of the proof
table and holds every check name, every op and layer kind (each at its
largest TP) and every test; with its kill table, per row of the proof table
the tier's cases that catch it.  The whole corpus (``suite/test_corpus.py``,
shipped and ``--coc-corpus``) and the fused kernels' goldens (:data:`HELD`)
are in the tier too.  The scheduling plugin marks
the cases at collection.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from conformance.caseids import matches

#: Where the chosen tier is kept.
TIER_FILE = Path(__file__).resolve().with_name("smoke_tier.json")
#: The corpus: in the tier whole, whatever it holds.
CORPUS = "test_corpus.py::*"
#: The goldens inside torch_npu's MC2 kernels' documented domain (each kernel at TP 2, 4 and 8): they reach a fused
#: kernel only on an NPU node, where the rows of the faults misusing them are proved (the kill runs are the CPU's,
#: where those faults never reach a kernel), so the tier holds them whatever it chooses.
FUSED_GOLDENS: tuple[str, ...] = (
    "test_ops.py::test_op_matches_golden[*-m64k512n64-float16-bias-tp2*]",
    "test_ops.py::test_op_matches_golden[*-m64k256n64-float16-bias-tp4*]",
    "test_ops.py::test_op_matches_golden[*-m64k2048n32-bfloat16-nobias-tp8*]",
)
#: What the tier holds whatever the choice.
HELD: tuple[str, ...] = (CORPUS, *FUSED_GOLDENS)


@dataclass(frozen=True)
class SmokeTier:
    """The chosen tier as kept in :data:`TIER_FILE`."""

    cases: frozenset[str]  #: case ids (the corpus aside)
    kills: dict[str, tuple[str, ...]]  #: proof row -> the tier's cases that catch its fault


@functools.cache
def smoke_tier() -> SmokeTier:
    """The kept tier (read once)."""
    data = json.loads(TIER_FILE.read_text(encoding="utf-8"))
    return SmokeTier(frozenset(data["cases"]), {row: tuple(cases) for row, cases in data["kills"].items()})


def in_smoke(case: str) -> bool:
    """Whether the case id belongs to the smoke tier."""
    return case in smoke_tier().cases or any(matches(case, pattern) for pattern in HELD)
