"""What rank tasks return: the typed values ``conformance.cases`` produces and ``conformance.judge`` reads.

Every result crosses a process boundary, so each is a plain picklable
dataclass of tensors, :class:`~conformance.contract.rank_errors.CapturedError` and
:class:`ObservedCollectives` values (what the harness's probes saw, summarised by
:func:`conformance.harness.observed.observed_collectives`; not the two-lane model of
:mod:`coc_shared.timeline`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conformance.contract.rank_errors import CapturedError


@dataclass(frozen=True)
class ObservedMatmul:
    """One matmul: its output shape and the names its operands carried (e.g. the layer's weight ``w1``)."""

    shape: tuple[int, ...] | None
    operands: frozenset[str] = frozenset()

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape)) if self.shape else "?"
        return f"mm[{shape}]" + (f" of {'+'.join(sorted(self.operands))}" if self.operands else "")


@dataclass(frozen=True)
class ObservedCollective:
    """One collective as a check needs it (what a probe recorded of one call)."""

    kind: str
    op: str
    api: str | None
    overlappable: bool
    group_ranks: tuple[int, ...] | None
    shapes: tuple[tuple[int, ...], ...]
    #: The matmuls that ran while it was in flight (launched, not yet waited for).
    overlapped: tuple[ObservedMatmul, ...]
    pending: bool  #: launched asynchronously and never waited for
    #: Whether its group existed when it ran: "live", "gone" (destroyed; ranks from an earlier recording), "unknown".
    group_state: str = "live"


@dataclass(frozen=True)
class ObservedCollectives:
    """The collectives of one phase of one layer (or one op call), in launch order."""

    collectives: tuple[ObservedCollective, ...] = ()
    fused_ops: tuple[str, ...] = ()  #: vendor ops that multiply and communicate in one
    #: Collectives a thread no recording mode reached issued meanwhile (each names the entry point or op and the
    #: thread): not recorded, so the phase's structure is not judged.
    other_threads: tuple[str, ...] = ()
    #: Matmuls such a thread ran meanwhile (named so): not recorded either.
    other_thread_matmuls: tuple[str, ...] = ()

    def of_kind(self, kind: str) -> list[ObservedCollective]:
        return [c for c in self.collectives if c.kind == kind]

    def describe(self) -> str:
        parts = [f"{c.kind}{'(async)' if c.overlappable else '(sync)'}"
                 + (f" while {', '.join(m.describe() for m in c.overlapped)}" if c.overlapped else "")
                 for c in self.collectives]
        return "[" + ", ".join(parts) + "]" + (f" fused ops {list(self.fused_ops)}" if self.fused_ops else "")


@dataclass(frozen=True)
class ConfigOutcome:
    """``configure`` on one rank: the error it raised, the collectives it issued."""

    error: CapturedError | None
    collectives: tuple[str, ...] = ()


@dataclass
class StepRun:
    """One optimizer step of patched or unpatched layers on one rank."""

    #: Per micro-batch: ``y`` and ``dx`` (this rank's pieces), each where its forward / backward came back.
    outputs: list[dict[str, Any]]
    #: Parameter gradients by golden name (``dw``, ``db``, ``dw1`` ...); a weight's is its
    #: ``main_grad`` under gradient-accumulation fusion.  Empty when a forward or backward of the step raised.
    grads: dict[str, Any]
    #: Under fusion: what the weight's ``.grad`` held after the backward ("None", "dummy", "values").
    weight_grad: dict[str, str] = field(default_factory=dict)


@dataclass
class LayerOutcome:
    """The serial (unpatched) and CoC runs of one layer case on one rank."""

    serial: list[StepRun] | None  #: per step
    coc: list[list[StepRun]]  #: per CoC run, per step
    replica: int = 0
    tp_rank: int = 0
    members: tuple[int, ...] = ()  #: global ranks of this rank's TP group
    #: ``"<layer kind>/<phase>"`` -> its collectives, for the first micro-batch of the first CoC run.
    timelines: dict[str, ObservedCollectives] = field(default_factory=dict)
    #: Every attempt the rank made, in order (``configure``, then each forward and backward of each micro-batch of
    #: each step, ``"run 1, step 0, micro-batch 1, forward"``), and what those that raised raised.
    attempts: list[str] = field(default_factory=list)
    errors: dict[str, CapturedError] = field(default_factory=dict)
    #: Collective kinds the first attempt that raised issued before it raised (a refusal must come before any).
    collectives_before_error: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    changed_after_return: list[str] = field(default_factory=list)
    mutated: list[str] = field(default_factory=list)
    shared_memory: list[str] = field(default_factory=list)

    @property
    def error(self) -> CapturedError | None:
        """What the first attempt that raised raised (None: every attempt came back)."""
        return next((self.errors[a] for a in self.attempts if a in self.errors), None)


@dataclass
class OpCallResults:
    """One problem's calls on one rank, one *attempt* each (tiling after tiling, each run after run): what each
    returned or raised, and what the rank observed.  Every per-attempt list has one entry per attempt."""

    results: list[Any]  #: what each attempt returned (None where it raised)
    errors: list[CapturedError | None] = field(default_factory=list)  #: what each attempt raised (None: returned)
    serial: Any = None
    mutated: dict[str, str] = field(default_factory=dict)
    changed_after_return: list[str] = field(default_factory=list)
    shared_memory: list[str] = field(default_factory=list)
    wrong_device: list[str] = field(default_factory=list)
    timelines: list[ObservedCollectives] = field(default_factory=list)

    @property
    def error(self) -> CapturedError | None:
        """What the first attempt that raised raised (None: every attempt returned)."""
        return next((e for e in self.errors if e is not None), None)


@dataclass
class OpRunOutcome:
    """Every call of an :class:`~conformance.contract.jobs.OpRun` on one rank, and where the rank sits."""

    calls: list[OpCallResults]
    replica: int
    tp_rank: int
    members: tuple[int, ...]
    groups_created: int = 0  #: process groups that appeared after the first call (a leak per call)
