"""The configuration kind: settings drawn with CoC enabled, judged against the contract's model, in process.

A spec (:class:`ConfigSpec`) is one ``configure`` call: a chunk count (every
valid one and values around them: 0, -1, 3, 16, 32, words, an empty string),
the fused kernel, a TP size (0 to 8), one incompatible model setting, and
``customized_coc`` entries valid or not.  What must come of it is
:func:`~conformance.contract.config_rules.expected_outcome`'s; the judging is
the fixed suite's (:mod:`conformance.judge.config_verdicts`).  It runs in the
test process (no ranks), so its cases are cheap.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from conformance.contract.config_rules import INCOMPATIBLE, expected_outcome
from conformance.explore.kind import Judged, Kind, Ranks, Scope, read_spec
from conformance.explore.space import Dimension, Space, towards, valid_neighbours, weighted
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.impl_loader import accepts_keyword
from conformance.harness.rank_warnings import observed_warnings
from conformance.judge.config_verdicts import judge_effective, judge_refused
from conformance.record.levels import Level
from conformance.record.verdicts import Verdicts

KIND_NAME = "config"
#: Chunk counts: the valid ones, then values around and beyond them.
CHUNK_VALUES = ("2", "1", "4", "8", "auto", "0", "-1", "3", "5", "6", "7", "9", "16", "32", "64", "many", "")
#: Chunk counts whose effective settings are a SHOULD: ``auto`` (the reference's measured choice) and ``1`` (one
#: chunk, no overlap: the reference reports CoC enabled with one chunk, the legacy variable's 1 means off, and the
#: protocol does not say which an implementation must report).
LENIENT_CHUNKS = ("auto", "1")
#: ``customized_coc`` recipes: none, a valid entry, and entries the contract refuses.
CUSTOMIZED: dict[str, dict[str, Any]] = {
    "none": {}, "valid": {"[64, 32, 32]": 2}, "count-3": {"[64, 32, 32]": 3}, "count-16": {"[8, 8, 8]": 16},
    "count-0": {"[64, 32, 32]": 0}, "count-string": {"[64, 32, 32]": "2"}, "count-bool": {"[64, 32, 32]": True},
    "key-x": {"64x32x32": 2}, "key-two": {"[64, 32]": 2}, "key-words": {"[m, k, n]": 2},
}


@dataclass(frozen=True)
class ConfigSpec:
    """``configure(["--use-ascend-coc", "--coc-parallel-num", chunks, ("--coc-fused-kernel")], {}, tp_size=...,
    <incompatible setting>, coc_cfgs={"customized_coc": ...})``."""

    chunks: str = "2"
    fused: bool = False
    tp_size: int = 2
    incompatible: str = "none"
    customized: str = "none"

    world = 0  #: runs in the test process
    tp = 0  #: forms no TP group (``tp_size`` is the setting it configures)

    @property
    def capability(self) -> str:
        return "configure"

    def invalid(self) -> str:
        if self.chunks not in CHUNK_VALUES or self.customized not in CUSTOMIZED or \
                self.incompatible not in ("none", *INCOMPATIBLE):
            return (f"chunks, customized and incompatible must be among {CHUNK_VALUES}, {tuple(CUSTOMIZED)} and "
                    f"{('none', *INCOMPATIBLE)}")
        if not 0 <= self.tp_size <= 8:
            return f"tp_size {self.tp_size} is outside 0..8"
        return ""

    def argv(self) -> list[str]:
        return ["--use-ascend-coc", "--coc-parallel-num", self.chunks] + (["--coc-fused-kernel"] if self.fused else [])

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"tp_size": self.tp_size}
        if self.incompatible != "none":
            keyword, value, _ = INCOMPATIBLE[self.incompatible]
            kwargs[keyword] = value
        if self.customized != "none":
            kwargs["coc_cfgs"] = {"customized_coc": dict(CUSTOMIZED[self.customized])}
        return kwargs

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND_NAME, **asdict(self)}

    def describe(self) -> str:
        extra = {k: v for k, v in self.kwargs().items() if k != "tp_size"}
        return f"configure argv={self.argv()} tp_size={self.tp_size}" + (f" {extra}" if extra else "")


#: Fields of the spec, simplest value first.
DIMENSIONS = Space(
    Dimension("chunks", weighted(CHUNK_VALUES, (3, 2, 2, 2, 2) + (1,) * (len(CHUNK_VALUES) - 5)),
              towards(*CHUNK_VALUES)),
    Dimension("fused", weighted((False, True), (3, 1)), towards(False, True)),
    Dimension("tp_size", weighted(tuple(range(9)), (1, 3, 6, 2, 4, 1, 1, 1, 4)),
              towards(2, 1, 4, 8, 3, 5, 6, 7, 0)),
    Dimension("incompatible", weighted(("none", *INCOMPATIBLE), (8,) + (1,) * len(INCOMPATIBLE)),
              towards("none", *INCOMPATIBLE)),
    Dimension("customized", weighted(tuple(CUSTOMIZED), (8, 3) + (1,) * (len(CUSTOMIZED) - 2)),
              towards(*CUSTOMIZED)),
)


def offered(scope: Scope) -> str:
    return "" if scope.configure else "the implementation has no configure"


def _fit(spec: ConfigSpec, scope: Scope | None) -> ConfigSpec:
    """Only what the implementation takes: the fused kernel where it declares fused layers, ``coc_cfgs`` where
    its ``configure`` takes them."""
    if scope is None:
        return spec
    if spec.fused and not scope.declarations.fused_layers:
        spec = replace(spec, fused=False)
    if spec.customized != "none" and not accepts_keyword(scope.impl.configure, "coc_cfgs"):
        spec = replace(spec, customized="none")
    return spec


def draw(rng: random.Random, scope: Scope | None = None) -> ConfigSpec:
    return _fit(ConfigSpec(**DIMENSIONS.draw(rng)), scope)


def neighbours(spec: ConfigSpec) -> Iterator[ConfigSpec]:
    return valid_neighbours(spec, DIMENSIONS.simpler(spec))


def tags(spec: ConfigSpec) -> list[str]:
    outcome = _outcome(spec)
    return DIMENSIONS.tags(spec) + [f"refused={outcome.must_refuse}"]


def buckets() -> dict[str, tuple[str, ...]]:
    """Every ``dimension=bucket`` :func:`tags` names, each one a draw reaches."""
    return {**DIMENSIONS.buckets(), "refused": ("False", "True")}


def _outcome(spec: ConfigSpec) -> Any:
    return expected_outcome(spec.chunks, fused=spec.fused, tp_size=spec.tp_size,
                            incompatible=None if spec.incompatible == "none" else spec.incompatible,
                            customized=CUSTOMIZED[spec.customized])


def subject(spec: ConfigSpec) -> str:
    """What a failure of ``spec`` is about: each setting that alone must (or may) be refused, else its chunk count."""
    plain = ConfigSpec()
    refused = [f"{d.name}={getattr(spec, d.name)}" for d in DIMENSIONS
               if getattr(spec, d.name) != getattr(plain, d.name)
               and _outcome(replace(plain, **{d.name: getattr(spec, d.name)})).refusals]
    return ", ".join(refused) or f"chunks={spec.chunks}" + (", fused" if spec.fused else "")


def judge_spec(ranks: Ranks, spec: ConfigSpec, scope: Scope, verdicts: Verdicts) -> Judged:
    """``configure`` with ``spec``'s setting, judged against the contract's model by the fixed suite's rules."""
    if _fit(spec, scope) != spec:
        return Judged(skipped=f"{scope.impl.name} takes no fused kernel or no coc_cfgs")
    with observed_warnings():  # warnings are a SHOULD of the fixed cases, not judged here
        call_capturing_errors(scope.impl.configure, [], {}, tp_size=2)  # imports what configure imports lazily
        config, error = call_capturing_errors(scope.impl.configure, spec.argv(), {}, **spec.kwargs())
    outcome, what = _outcome(spec), spec.describe()
    if not outcome.refusals:
        judge_effective(verdicts, config, error, outcome.effective, Level.SHOULD if spec.chunks in LENIENT_CHUNKS
                        else Level.MUST, what)
    else:
        kinds = {r.kind for r in outcome.refusals}
        judge_refused(verdicts, error, scope.declarations, names="|".join(f"(?:{r.names})" for r in outcome.refusals),
                      kind=kinds.pop() if len(kinds) == 1 else None, level=Level.MUST, what=what,
                      or_correct=not outcome.must_refuse)
    return Judged.of(verdicts)


def from_dict(data: dict[str, Any]) -> ConfigSpec:
    """The spec of :meth:`ConfigSpec.as_dict`."""
    return read_spec(ConfigSpec, data)  # type: ignore[return-value]


KIND = Kind(KIND_NAME, weight=3.0, offered=offered, draw=draw, neighbours=neighbours, tags=tags, judge=judge_spec,
            from_dict=from_dict, spec_type=ConfigSpec, buckets=buckets, subject=subject)
