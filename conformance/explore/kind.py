"""What a kind of case gives the explorer (draw, simplify, judge), what the implementation offers it, verdicts.

Each kind of case -- calls of the fused ops, layers in training,
configurations, w8A16 calls -- is one module of ``conformance/explore/`` that builds one
:class:`Kind` from its own spec class and space; the explorer, the shrinker
and the finding files know nothing else of it.  A kind judges its case with
the suite's own judging sequence for that kind (``conformance/judge/``), so a
case the explorer finds fails the same named check a suite test would.

A failure is identified by what failed -- the check's name, its level and the
failure's category (:class:`FailureKey`), which the explorer pairs with the
kind of case -- never by its message, whose sizes differ from case to case.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from conformance.contract.rank_errors import CapturedError
from conformance.explore.spec import Spec, SpecError, require_runnable
from conformance.harness.case_errors import HANGS, CaseError
from conformance.harness.impl_loader import accepts_keyword, missing_capability
from conformance.harness.runner import CaseTimings
from conformance.judge.checks import not_implemented
from conformance.protocol import FUSED_OPS, Declarations
from conformance.record.levels import Level
from conformance.record.verdicts import FAILED, PASSED, Verdicts

#: The check a case fails when it does not finish on every rank (hang, crash, unexpected rank error).
FINISHED = "the case finished on every rank"


class Ranks(Protocol):
    """What the explorer needs of :class:`~conformance.harness.runner.CaseRanks`."""

    timings: CaseTimings

    def run(self, fn: Any, world_size: int, **params: Any) -> list[Any]: ...


@dataclass(frozen=True)
class Scope:
    """What the implementation under test offers the explorer: its ops, its modes, whether it patches layers."""

    impl: Any
    declarations: Declarations = field(default_factory=Declarations)
    ops: tuple[str, ...] = FUSED_OPS  #: the fused ops it provides
    blocks: frozenset[str] = frozenset()  #: the ops that take an explicit tiling (``blocks=``)
    w8a16: bool = False  #: ``matmul_all_reduce`` takes int8 weights with scales (its keywords)
    layers: str = ""  #: why no layer case can run ("" when they can: it patches Megatron and megatron-core is here)
    configure: bool = False  #: it has ``configure`` (configuration cases)
    devices: int | None = None  #: ranks this node hosts at once (None: no limit)
    tp_sizes: frozenset[int] | None = None  #: ``--coc-tp``: the only TP sizes of cases on ranks (None: any)

    @classmethod
    def of(cls, impl: Any, declarations: Declarations, *, megatron: str = "", devices: int | None = None,
           tp_sizes: frozenset[int] | None = None) -> Scope:
        """The scope of ``impl``; ``megatron`` says why megatron-core cannot build layers here ("" when it can)."""
        ops = tuple(op for op in FUSED_OPS if not missing_capability(impl, op))
        return cls(impl, declarations, ops,
                   blocks=frozenset(op for op in ops if accepts_keyword(getattr(impl, op), "blocks")),
                   w8a16="matmul_all_reduce" in ops and accepts_keyword(impl.matmul_all_reduce, "antiquant_scale"),
                   layers=missing_capability(impl, "patch_megatron") or megatron,
                   configure=not missing_capability(impl, "configure"), devices=devices, tp_sizes=tp_sizes)

    def outside(self, spec: Spec) -> str:
        """Why ``spec`` is out of this run's reach ("" when it is not): more ranks than the node has, or a TP size
        ``--coc-tp`` leaves out."""
        if self.devices is not None and spec.world > self.devices:
            return f"needs {spec.world} ranks, this node hosts {self.devices}"
        if self.tp_sizes is not None and spec.world and spec.tp not in self.tp_sizes:
            return f"TP {spec.tp} is not among --coc-tp {','.join(map(str, sorted(self.tp_sizes)))}"
        return ""


@dataclass(frozen=True)
class FailureKey:
    """What failed: the check, its level, the failure's category, and what of the case it failed on (``subject``:
    the op, the setting, the argument, the layer -- so one op's defect hides no other op's)."""

    check: str
    level: Level
    category: str
    subject: str = ""

    @property
    def name(self) -> str:
        """The check's name as the explorer records it: ``subject: check``."""
        return f"{self.subject}: {self.check}" if self.subject else self.check

    @property
    def way(self) -> FailureKey:
        """The way it failed, whatever it failed on (what shrinking keeps: a sequence may shrink to one op)."""
        return replace(self, subject="")

    def about(self, subject: str) -> FailureKey:
        return replace(self, subject=subject)

    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-")


@dataclass(frozen=True)
class Judged:
    """One case's verdict: each failed check's key and message, and each check judged ("skipped" says why nothing
    was judged; ``not_offered``: the modes a case needed that the implementation does not offer)."""

    failures: tuple[tuple[FailureKey, str], ...] = ()
    skipped: str = ""
    not_offered: frozenset[str] = frozenset()
    judged: tuple[FailureKey, ...] = ()  #: every check recorded with an outcome (passed or failed), by key

    @classmethod
    def of(cls, verdicts: Verdicts) -> Judged:
        """The failures ``verdicts`` recorded, and the checks it judged."""
        return cls(tuple((FailureKey(r.name, r.level, r.category), r.message) for r in verdicts.results if r.failed),
                   judged=tuple(FailureKey(r.name, r.level, r.category) for r in verdicts.results
                                if r.outcome in (PASSED, FAILED)))


def unoffered(errors: Sequence[CapturedError | None], modes: Iterable[str]) -> Judged | None:
    """The one rule of ``NotImplementedError`` (the fixed suite's ``require_offered``): when every entry
    of ``errors`` raised it, the case is not judged and its ``modes`` are not offered (None otherwise)."""
    why = not_implemented(errors)
    return Judged(skipped=why, not_offered=frozenset(modes)) if why else None


def record(verdicts: Verdicts, key: FailureKey, message: str) -> None:
    """Record into ``verdicts`` that check ``key`` failed with ``message`` (its category kept)."""
    verdicts.fail(key.name, key.level, message, category=key.category)


def run_to_the_end(ranks: Ranks, spec: Spec, verdicts: Verdicts, task: Any, **params: Any) -> list[Any] | Judged:
    """``task`` run on ``spec.world`` ranks: every rank's result, or the verdict of a case that did not finish.

    A case that does not finish on every rank fails check :data:`FINISHED`
    (category ``hang`` for hangs and crashes, ``error`` for an unexpected rank error).
    """
    try:
        return ranks.run(task, spec.world, **params)
    except CaseError as exc:
        key = FailureKey(FINISHED, Level.MUST, "hang" if isinstance(exc, HANGS) else "error")
        message = f"{spec.describe()}: {type(exc).__name__}: {exc}"
        record(verdicts, key, message)
        return Judged(((key, message),))


def outcomes_to_judge(ranks: Ranks, spec: Spec, verdicts: Verdicts, task: Any, *, modes: frozenset[str] = frozenset(),
                      **params: Any) -> list[Any] | Judged:
    """``task`` run on ``spec.world`` ranks (:func:`run_to_the_end`): every rank's result to judge, or the verdict
    already reached -- a case that did not finish, or one the implementation does not offer (:func:`unoffered`:
    every rank's ``error`` a ``NotImplementedError``, its ``modes`` not offered)."""
    outcomes = run_to_the_end(ranks, spec, verdicts, task, **params)
    if isinstance(outcomes, Judged):
        return outcomes
    return unoffered([o.error for o in outcomes], modes) or outcomes


def read_spec(spec_type: Callable[..., Spec], data: Mapping[str, Any],
              convert: Callable[[dict[str, Any]], dict[str, Any]] = dict) -> Spec:
    """The spec of ``spec_type`` a ``Spec.as_dict`` describes (its fields ``convert``ed from JSON), checked runnable."""
    try:
        spec = spec_type(**convert({k: v for k, v in data.items() if k != "kind"}))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(f"malformed spec: {exc}") from None
    require_runnable(spec)
    return spec


@dataclass(frozen=True)
class Kind:
    """One kind of case: its name in a spec's JSON, its share of the draws, and how it is drawn, simplified, judged.

    ``offered(scope)`` says why the implementation offers no case of this kind
    ("" when it does); ``draw`` returns a valid spec; ``neighbours`` every valid
    one-step-simpler spec, simplest first; ``tags`` the ``dimension=bucket``
    counts of a spec, ``buckets`` every bucket of every dimension a draw
    reaches (none that it cannot); ``judge`` runs it and records the suite's
    checks into the verdicts; ``from_dict`` reads :meth:`Spec.as_dict` back
    (raising :class:`~conformance.explore.spec.SpecError`).
    """

    name: str
    weight: float
    offered: Callable[[Scope], str]
    draw: Callable[[random.Random, Scope], Spec]
    neighbours: Callable[[Any], Iterator[Spec]]
    tags: Callable[[Any], list[str]]
    judge: Callable[[Ranks, Any, Scope, Verdicts], Judged]
    from_dict: Callable[[dict[str, Any]], Spec]
    spec_type: type = object
    #: Every ``dimension -> buckets`` :attr:`tags` names (each one a draw reaches).
    buckets: Callable[[], Mapping[str, tuple[str, ...]]] = dict
    #: The modes of the implementation a spec needs (a ``NotImplementedError`` marks them not offered).
    modes: Callable[[Any], frozenset[str]] = lambda spec: frozenset({spec.capability})
    #: What of a spec a failure is about (:attr:`FailureKey.subject`): its op, setting, argument or layer.
    subject: Callable[[Any], str] = lambda spec: ""
