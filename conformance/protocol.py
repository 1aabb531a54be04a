"""The plug-in protocol (version 2): what the suite needs from a CoC implementation.

The suite reaches an implementation only through this protocol (selected with
``--coc-impl module:attr``); the reference implementation is just the default.

Required: ``name`` and ``configure``.  Everything else is a capability:

* a missing op, or an op that raises :class:`NotImplementedError` for a call,
  is a capability the implementation lacks: the cases needing it are skipped
  with that reason (the implementation's own message when it raised), never
  failed or passed.  This holds per *mode* too: an op that raises
  ``NotImplementedError`` for ``deterministic=True``, for the w8A16 arguments
  or for an explicit ``blocks`` tiling skips exactly those cases;
* ``deterministic=True`` (:data:`DETERMINISTIC_OPS`) means what HCCL's and
  cuBLAS's determinism mean: bitwise the same result for the same inputs,
  configuration and tiling (``blocks``), run after run, whatever order the
  ranks reach each collective in and however late some are.  Any fixed
  summation order will do.  A different tiling may give other bits (a GEMM
  may round a row by the rows of its tile); it is judged by the error bound,
  unless the implementation declares ``split_invariant_ops`` (below);
* ``patch_megatron(config)`` is a context manager replacing (and restoring on
  exit) the forward of megatron.core's ColumnParallelLinear and
  RowParallelLinear.

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

__all__ = [
    "CAPABILITIES", "DETERMINISTIC_OPS", "DEVICE_KINDS", "ERROR_KINDS", "FUSED_OPS", "MATMULS", "PHASE_COLLECTIVES",
    "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Chunked", "CoCImplementation", "DeclarationError", "Declarations",
    "EffectiveConfig", "NotOverlapped", "OverlapStrategy", "OverlapsMatmul", "ParallelNum", "declarations",
    "overlap_key", "parse_strategy",
]

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Union, runtime_checkable

#: The version this suite speaks; it also accepts implementations of :data:`SUPPORTED_VERSIONS`.
PROTOCOL_VERSION = 2
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2)

ParallelNum = Union[int, Literal["auto"]]

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


@runtime_checkable
class EffectiveConfig(Protocol):
    """The configuration an implementation settled on (``docs/DESIGN.md#configuration``)."""

    enabled: bool
    parallel_num: ParallelNum
    fused_kernel: bool
    user_cfgs: Any


@runtime_checkable
class CoCImplementation(Protocol):
    """A CoC implementation under test.

    Op conventions (per rank of the TP group ``group`` of size ``tp``):
    ``x`` is ``[m, k]``; ``w`` is ``[k, n]``, or ``[n, k]`` when
    ``transpose_weight`` is true (never inferred from shapes).

    * ``matmul_all_reduce`` -> ``allreduce_sum(x @ w) + bias``, ``[m, n]``
    * ``matmul_reduce_scatter`` -> ``reduce_scatter_sum(x @ w)`` along m, ``[m/tp, n]``
    * ``all_gather_matmul`` -> ``all_gather(x) @ w``, ``[m*tp, n]``
    * ``all_gather_matmul_v2`` -> the same and the gathered ``x``, ``[m*tp, k]``

    Results are values: complete when returned (no collective left pending),
    never changed afterwards, sharing memory with no other call's result and
    (unless declared in ``in_place_ops``) with no input; inputs are left
    unchanged.  ``configure`` refuses invalid or incompatible settings
    identically on every rank and before any collective.
    """

    name: str
    """A short name for reports (``"reference"``, ``"mindspeed"``)."""

    def configure(
        self,
        argv: Sequence[str] | None,
        env: Mapping[str, str] | None,
        *,
        tp_size: int,
        num_experts: int | None = None,
        use_ascend_mc2: bool = False,
        tp_2d: bool = False,
        transformer_impl: str = "local",
        coc_cfgs: Mapping[str, Any] | None = None,
    ) -> EffectiveConfig:
        """Settle the CoC configuration from the command line, the environment and the model's settings.

        Called on every rank of the TP group with the same arguments.

        Must: read ``--use-ascend-coc``, ``--coc-parallel-num {1,2,4,8,auto}``
        and ``--coc-fused-kernel`` from ``argv`` (unknown arguments are
        someone else's: ignore them), with the flag winning over a legacy
        variable in ``env``; return an :class:`EffectiveConfig` saying what is
        in force; refuse every invalid value and every incompatible setting
        (MC2, MoE, 2-D TP, Transformer Engine layers, the fused kernel at a TP
        other than 8) *when CoC is enabled*, identically on every rank, before
        any collective, with a message naming the setting.

        Must not: issue a collective (a rank left waiting in one hangs), read
        ``os.environ`` instead of ``env``, or refuse anything while CoC is off.

        May raise: any exception for a refusal; the class declared in
        ``error_types`` for its kind (``config`` or ``incompatible``) is a
        SHOULD.  Should warn once per setting it overrides or ignores.
        """
        ...

    def matmul_all_reduce(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
        deterministic: bool = False, antiquant_scale: Any = None, antiquant_offset: Any = None,
        antiquant_group_size: int = 0,
    ) -> Any:
        """``allreduce_sum(x @ w) + bias`` over ``group``: ``[m, n]`` on every rank, bias added once.

        Must: return a new tensor of ``x``'s dtype and device within the error
        bound of the float64 result on every rank; with
        ``deterministic=True``, bitwise the same result for the same inputs
        and tiling whatever the order ranks arrive in (across tilings only
        where declared in ``split_invariant_ops``); with int8 ``w`` and
        ``antiquant_scale`` (per tensor ``[1]``,
        per channel ``[n]`` or per group ``[ceil(k/g), n]`` with
        ``antiquant_group_size=g``), multiply by ``(w + offset) * scale``.

        Must not: change ``x``, ``w`` or ``bias``; return before its
        collectives completed; reuse a buffer another call's result lives in.

        May raise: :class:`NotImplementedError` for a mode it lacks (the cases
        skip); for bad arguments (a scale of the wrong shape, a group size not
        a multiple of 32) an error naming the argument, on every rank, before
        any collective.
        """
        ...

    def matmul_reduce_scatter(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
        deterministic: bool = False,
    ) -> Any:
        """``reduce_scatter_sum(x @ w)`` along m (+ bias): rank ``r`` gets rows ``r*m/tp : (r+1)*m/tp``.

        Must: the rows one reduce-scatter would give this rank, within the
        bound (reproducible with ``deterministic=True``, as above); an ``m`` that
        ``tp`` does not divide is refused on every rank before any collective,
        naming m and tp.  Must not: anything :meth:`matmul_all_reduce` must not.
        May raise: :class:`NotImplementedError` for a mode it lacks.
        """
        ...

    def all_gather_matmul(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
    ) -> Any:
        """``all_gather(x) @ w`` (+ bias): ``[m*tp, n]``, the gathered rows rank-major as one all-gather places them.

        Must: every rank's rows in rank order, within the bound.  Must not:
        anything :meth:`matmul_all_reduce` must not.  May raise:
        :class:`NotImplementedError` for a mode it lacks.
        """
        ...

    def all_gather_matmul_v2(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
    ) -> tuple[Any, Any]:
        """:meth:`all_gather_matmul` and the gathered ``x`` (``[m*tp, k]``, exactly the inputs) as a pair."""
        ...

    def patch_megatron(self, config: EffectiveConfig) -> AbstractContextManager[Any]:
        """A context manager under which megatron.core's ColumnParallelLinear and RowParallelLinear use CoC.

        Must: inside, the layers' outputs, input gradients and parameter
        gradients stay within the bound of the serial layers for every token
        count (or a clear refusal on every rank naming m, the chunk count and
        tp); honour ``coc_cfgs`` (``customized_coc`` per matmul shape,
        ``recompute_all_gather``) and gradient-accumulation fusion into a
        pre-filled fp32 ``main_grad``; restore the layers on exit.

        Must not: keep results or weights across calls (a layer's weights
        change in place between steps), or leave the layers patched after exit.

        May raise: :class:`NotImplementedError` for a mode it lacks (the cases skip).
        """
        ...


#: The fused ops (module docstring), by their method names.
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
