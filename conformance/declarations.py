"""What a CoC implementation may declare about itself (plug-in protocol, version 2), and how it is read.

The vocabulary of the declarations (error kinds, phases, overlap strategies, ops,
device kinds) and :func:`declarations`, which reads them with their defaults and
refuses a malformed one with :class:`DeclarationError`.  Users import these names
from :mod:`conformance.protocol`, the protocol they implement.

Optional declarations (attributes of the implementation, all new in version 2;
:func:`declarations` reads them with their defaults):

``protocol_version``
    ``2``; absent means ``1`` (``configure`` may then lack ``coc_cfgs``, and
    the cases needing ``coc_cfgs`` skip).
``error_types``
    ``{kind: class or tuple of classes}`` for the kinds in :data:`ERROR_KINDS`.
    A refusal is judged in two parts: that every rank refused, before any
    collective, with a message naming the setting (MUST, any exception
    passes) and that the exception is of the declared class (SHOULD; with no
    declaration for the kind that SHOULD check fails and says so).
``overlap``
    ``{"<layer>/<sp|nosp>/<phase>": strategy}`` (:func:`overlap_key`): how
    each phase of each layer overlaps its collective -- ``"chunked"``,
    ``"overlaps:<matmul>"`` (one of :data:`MATMULS`) or ``"none"``, or the
    objects :class:`Chunked`, :class:`OverlapsMatmul`, :class:`NotOverlapped`
    (plain strings need no import of this suite).  STRUCTURE checks judge the
    implementation against this; an undeclared phase is only checked to let
    its collective overlap *some* matmul.
``fused_overlap``
    The same for the fused-kernel layers (``--coc-fused-kernel``), which tile
    by their own plan: a phase declared :class:`Chunked` there is only
    required to overlap some matmul.
``fused_layers``
    ``False`` when the implementation has no fused-kernel layers
    (``--coc-fused-kernel``): those cases are skipped.  Default ``True``.
``in_place_ops``
    Names of ops whose result may share memory with an input.  Default none.
``notes``
    Lines the run's report should carry about this implementation (the JSON
    summary's ``implementation_notes`` and the terminal summary): e.g. an
    adapter saying its checkout is not the commit its expectations were
    written for.  Default none.
``split_invariant_ops``
    Ops of :data:`DETERMINISTIC_OPS` whose ``deterministic=True`` results are
    also *split-invariant*: bitwise the same whatever the tiling, the chunk
    count and the row split of the same call (torch_npu's "strong" and
    "batch" consistency levels).  Names of ops (on every device), or
    ``{device kind: names}`` (a kind of :data:`DEVICE_KINDS`: ``"cpu"``,
    ``"cuda"``, ``"npu"``; any other key is refused) where it holds on some
    devices only (a GEMM that gives a row the same bits at any row count);
    the suite judges it on the ranks' device.  Default none: tilings
    are then judged by the error bound.  Added without a version bump: an
    implementation that declares nothing is judged as before, except that
    tilings of its deterministic mode no longer need to agree bitwise.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

__all__ = [
    "CAPABILITIES", "DETERMINISTIC_OPS", "DEVICE_KINDS", "ERROR_KINDS", "FUSED_OPS", "MATMULS", "PHASE_COLLECTIVES",
    "SUPPORTED_VERSIONS", "Chunked", "DeclarationError", "Declarations", "NotOverlapped", "OverlapStrategy",
    "OverlapsMatmul", "declarations", "overlap_key", "parse_strategy",
]

#: The protocol versions this suite accepts.
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2)

#: ``config``: an invalid value (chunk count, coc_cfgs key or value, malformed flag);
#: ``incompatible``: a valid setting CoC cannot combine with (MC2, MoE, TP 2-D, TE, fused TP != 8);
#: ``shape``: a token count or tiling the op or layer cannot split;
#: ``backend_unavailable``: a backend (fused kernels) that cannot run here;
#: ``argument``: a bad op argument (antiquant scale, offset, group size, dtype).
ERROR_KINDS: tuple[str, ...] = ("config", "incompatible", "shape", "backend_unavailable", "argument")

#: Matmuls a phase's collective may be declared to overlap (named by what they compute).
MATMULS: tuple[str, ...] = ("output", "input_grad", "weight_grad")


@dataclass(frozen=True)
class Chunked:
    """The phase's collective is cut into the configured number of chunks, each issued asynchronously."""


@dataclass(frozen=True)
class OverlapsMatmul:
    """One asynchronous collective, in flight while the named matmul (:data:`MATMULS`) runs."""

    matmul: str

    def __post_init__(self) -> None:
        if self.matmul not in MATMULS:
            raise ValueError(f"OverlapsMatmul: matmul must be one of {MATMULS}, got {self.matmul!r}")


@dataclass(frozen=True)
class NotOverlapped:
    """The phase's collective is not overlapped (declared honestly, judged as such)."""


OverlapStrategy = Union[Chunked, OverlapsMatmul, NotOverlapped]


def overlap_key(layer: str, sequence_parallel: bool, phase: str) -> str:
    """``"column/sp/backward"``: the key of one phase in an ``overlap`` declaration."""
    return f"{layer}/{'sp' if sequence_parallel else 'nosp'}/{phase}"


#: The collective each layer phase overlaps with its matmul (``docs/DESIGN.md#layouts``).
PHASE_COLLECTIVES: dict[str, str] = {
    overlap_key("column", False, "backward"): "all_reduce",
    overlap_key("column", True, "forward"): "all_gather",
    overlap_key("column", True, "backward"): "reduce_scatter",
    overlap_key("row", False, "forward"): "all_reduce",
    overlap_key("row", True, "forward"): "reduce_scatter",
    overlap_key("row", True, "backward"): "all_gather",
}


#: The fused ops (:class:`conformance.protocol.CoCImplementation`), by their method names.
FUSED_OPS: tuple[str, ...] = ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2")
#: Capabilities beyond ``configure``; a case names the ones it needs.
CAPABILITIES: tuple[str, ...] = (*FUSED_OPS, "patch_megatron")
#: The ops with a ``deterministic=True`` mode (the reductions).
DETERMINISTIC_OPS: tuple[str, ...] = ("matmul_all_reduce", "matmul_reduce_scatter")
#: The device kinds ranks run on (``torch.device(...).type``), the keys a per-device declaration may use.
DEVICE_KINDS: tuple[str, ...] = ("cpu", "cuda", "npu")


@dataclass(frozen=True)
class Declarations:
    """What an implementation declares about itself, with the defaults filled in."""

    version: int = 1
    error_types: Mapping[str, tuple[type[BaseException], ...]] = field(default_factory=dict)
    overlap: Mapping[str, OverlapStrategy] = field(default_factory=dict)
    fused_overlap: Mapping[str, OverlapStrategy] = field(default_factory=dict)
    fused_layers: bool = True
    in_place_ops: frozenset[str] = frozenset()
    #: The ops whose deterministic results are split-invariant on the device the ranks run on.
    split_invariant_ops: frozenset[str] = frozenset()

    def error_type(self, kind: str) -> tuple[type[BaseException], ...] | None:
        """The classes declared for ``kind`` (one of :data:`ERROR_KINDS`), or None."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {kind!r}; known: {ERROR_KINDS}")
        return self.error_types.get(kind)


class DeclarationError(TypeError):
    """An implementation's declarations do not follow this protocol."""


def declarations(impl: Any, device: str = "cpu", *, computed: bool = True) -> Declarations:
    """Read and validate ``impl``'s optional declarations (module docstring), for ranks on ``device`` (a device
    kind: what a per-device declaration is read for).

    ``computed=False`` leaves out a declaration the implementation computes when it is read (a property of its
    class: the reference measures its machine's GEMM to say where it is split-invariant), so a session can
    refuse malformed plain declarations up front at no cost; the cases that judge by it read it whole.
    """
    name = getattr(impl, "name", type(impl).__name__)
    version = getattr(impl, "protocol_version", 1)
    if version not in SUPPORTED_VERSIONS:
        raise DeclarationError(f"{name}: protocol_version {version!r} is not one of {SUPPORTED_VERSIONS}")
    errors: dict[str, tuple[type[BaseException], ...]] = {}
    for kind, classes in dict(getattr(impl, "error_types", None) or {}).items():
        group = classes if isinstance(classes, tuple) else (classes,)
        if kind not in ERROR_KINDS:
            raise DeclarationError(f"{name}: error_types has unknown kind {kind!r}; known: {ERROR_KINDS}")
        if not group or not all(isinstance(c, type) and issubclass(c, BaseException) for c in group):
            raise DeclarationError(f"{name}: error_types[{kind!r}] must be exception classes, got {classes!r}")
        errors[kind] = group
    overlap = _overlap(name, "overlap", getattr(impl, "overlap", None))
    fused_overlap = _overlap(name, "fused_overlap", getattr(impl, "fused_overlap", None))
    fused = getattr(impl, "fused_layers", True)
    if not isinstance(fused, bool):
        raise DeclarationError(f"{name}: fused_layers must be True or False, got {fused!r}")
    in_place = frozenset(getattr(impl, "in_place_ops", ()) or ())
    unknown = in_place - set(CAPABILITIES)
    if unknown:
        raise DeclarationError(f"{name}: in_place_ops names unknown ops {sorted(unknown)}")
    split = _split_invariant(name, _declared(impl, "split_invariant_ops", computed) or (), device)
    return Declarations(version, errors, overlap, fused_overlap, fused, in_place, split)


def _declared(impl: Any, attribute: str, computed: bool) -> Any:
    """``impl``'s ``attribute``, or None where it is computed on reading (a property) and ``computed`` is off."""
    if not computed and isinstance(inspect.getattr_static(type(impl), attribute, None), property):
        return None
    return getattr(impl, attribute, None)


def _split_invariant(name: str, raw: Any, device: str) -> frozenset[str]:
    """``split_invariant_ops`` on ``device``: names of ops, or ``{device kind: names}``."""
    per_device = dict(raw) if isinstance(raw, Mapping) else {device: raw}
    unknown = [kind for kind in per_device if kind not in DEVICE_KINDS]
    if isinstance(raw, Mapping) and unknown:  # "gpu", "CUDA", "cuda:0" would judge nothing on any device
        raise DeclarationError(f"{name}: split_invariant_ops keys must be device kinds {DEVICE_KINDS} (a device's "
                               f"type, lower case, no index), got {sorted(map(repr, unknown))}")
    for kind, ops in per_device.items():
        if isinstance(ops, str) or not set(ops or ()) <= set(DETERMINISTIC_OPS):
            raise DeclarationError(f"{name}: split_invariant_ops[{kind!r}] must name ops of {DETERMINISTIC_OPS}, "
                                   f"got {ops!r}")
    return frozenset(per_device.get(device) or ())


def parse_strategy(value: Any) -> OverlapStrategy:
    """``"chunked"``, ``"overlaps:<matmul>"``, ``"none"`` (or a strategy object) as a strategy object."""
    if isinstance(value, (Chunked, OverlapsMatmul, NotOverlapped)):
        return value
    if value == "chunked":
        return Chunked()
    if value == "none":
        return NotOverlapped()
    if isinstance(value, str) and value.startswith("overlaps:"):
        return OverlapsMatmul(value.removeprefix("overlaps:"))
    raise ValueError(f"expected 'chunked', 'overlaps:<{'|'.join(MATMULS)}>' or 'none', got {value!r}")


def _overlap(name: str, attr: str, raw: Any) -> dict[str, OverlapStrategy]:
    found: dict[str, OverlapStrategy] = {}
    for key, value in dict(raw or {}).items():
        if key not in PHASE_COLLECTIVES:
            raise DeclarationError(f"{name}: {attr} has unknown phase {key!r}; known: {sorted(PHASE_COLLECTIVES)}")
        try:
            found[key] = parse_strategy(value)
        except ValueError as exc:
            raise DeclarationError(f"{name}: {attr}[{key!r}]: {exc}") from None
    return found
