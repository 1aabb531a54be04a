"""What the configuration contract says a setting comes to: in force, or refused (naming what, as which kind).

One small model of the rules of ``docs/DESIGN.md#configuration`` for a
setting with CoC enabled on the command line -- the part of the space where
the contract leaves an implementation no choice: a chunk count in
``{1, 2, 4, 8, auto}`` or refused; the fused kernel at TP 8 only (it beats a
chunk count); MC2, 2-D TP and Transformer Engine refused (MoE: a refusal or
correct results); a TP size below 1 refused; ``customized_coc`` entries
``"[m, k, n]" -> {1, 2, 4, 8}`` or refused.  The explorer draws settings and
judges an implementation against this model; ``tests/unit`` holds the model to
every row of the fixed tables it covers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The chunk counts the contract accepts (and ``auto``).
VALID_CHUNK_COUNTS = ("1", "2", "4", "8", "auto")
#: The TP size the fused kernel runs at.
FUSED_TP = 8
#: Each incompatible model setting: its ``configure`` keyword and value, and what a refusal must name.
INCOMPATIBLE: Mapping[str, tuple[str, Any, str]] = {
    "mc2": ("use_ascend_mc2", True, r"use[-_]ascend[-_]mc2|\bmc2\b"),
    "tp-2d": ("tp_2d", True, r"tp[-_]2d|2-?D"),
    "transformer-engine": ("transformer_impl", "transformer_engine", r"transformer[-_ ]?(impl|engine)"),
    "moe": ("num_experts", 8, r"num[-_]experts|MoE"),
}
#: Incompatibilities a conforming implementation may accept instead (its results are then what must hold).
MAY_ACCEPT = ("moe",)
_SHAPE_KEY = re.compile(r"^\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


@dataclass(frozen=True)
class Refusal:
    """Why a setting must be refused: what the message must name (a regex), and the error kind it is declared as."""

    names: str
    kind: str  #: ``config`` or ``incompatible`` (protocol ``error_types``)
    optional: bool = False  #: a refusal or correct results


@dataclass(frozen=True)
class Outcome:
    """What a setting comes to: the effective values when nothing refuses it, else the refusals it must meet."""

    effective: Mapping[str, Any] = field(default_factory=dict)
    refusals: tuple[Refusal, ...] = ()

    @property
    def must_refuse(self) -> bool:
        return any(not r.optional for r in self.refusals)


def customized_refusal(entries: Mapping[str, Any]) -> Refusal | None:
    """The refusal ``customized_coc`` entries that break the contract must meet (None when they keep it): it names
    ``customized_coc``, or the malformed key itself."""
    for key, value in entries.items():
        if not isinstance(key, str) or not _SHAPE_KEY.match(key):
            return Refusal(r"customized_coc|" + re.escape(str(key)), "config")
        if isinstance(value, bool) or value not in (1, 2, 4, 8):
            return Refusal(r"customized_coc", "config")
    return None


def expected_outcome(chunks: str | None, *, fused: bool, tp_size: int, incompatible: str | None = None,
                     customized: Mapping[str, Any] | None = None) -> Outcome:
    """The outcome of ``--use-ascend-coc [--coc-parallel-num chunks] [--coc-fused-kernel]`` at ``tp_size`` with one
    ``incompatible`` model setting and ``customized_coc`` entries."""
    refusals = []
    if chunks is not None and chunks.strip().lower() not in VALID_CHUNK_COUNTS:
        refusals.append(Refusal(r"coc[-_]parallel[-_]num", "config"))
    if tp_size < 1:
        refusals.append(Refusal(r"tensor[-_ ]model[-_ ]parallel[-_ ]size|tp[-_ ]size", "config"))
    elif fused and tp_size != FUSED_TP:
        refusals.append(Refusal(r"--coc-fused-kernel", "incompatible"))
    if incompatible is not None:
        refusals.append(Refusal(INCOMPATIBLE[incompatible][2], "incompatible", optional=incompatible in MAY_ACCEPT))
    refused = customized_refusal(customized or {})
    if refused is not None:
        refusals.append(refused)
    effective: dict[str, Any] = {"enabled": True, "fused_kernel": fused}
    if not fused:
        value = (chunks or "1").strip().lower()
        effective["parallel_num"] = value if value == "auto" else int(value) if value.isdigit() else None
    return Outcome(effective, tuple(refusals))
