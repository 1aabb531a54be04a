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

Optional declarations (``protocol_version``, ``error_types``, ``overlap``,
``fused_overlap``, ``fused_layers``, ``in_place_ops``, ``notes``,
``split_invariant_ops``) say what an implementation does beyond the minimum;
:mod:`conformance.declarations` defines them and reads them.  Their names are
importable from here too: an implementation imports only this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union, runtime_checkable

from coc_shared.model_settings import ModelSettings
from conformance.declarations import (
    CAPABILITIES,
    DETERMINISTIC_OPS,
    DEVICE_KINDS,
    ERROR_KINDS,
    FUSED_OPS,
    MATMULS,
    PHASE_COLLECTIVES,
    SUPPORTED_VERSIONS,
    Chunked,
    DeclarationError,
    Declarations,
    NotOverlapped,
    OverlapsMatmul,
    OverlapStrategy,
    declarations,
    overlap_key,
    parse_strategy,
)

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack

__all__ = [
    "CAPABILITIES", "DETERMINISTIC_OPS", "DEVICE_KINDS", "ERROR_KINDS", "FUSED_OPS", "MATMULS", "PHASE_COLLECTIVES",
    "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Chunked", "CoCImplementation", "DeclarationError", "Declarations",
    "EffectiveConfig", "ModelSettings", "NotOverlapped", "OverlapStrategy", "OverlapsMatmul", "ParallelNum",
    "declarations", "overlap_key", "parse_strategy",
]

#: The version this suite speaks; it also accepts implementations of :data:`SUPPORTED_VERSIONS`.
PROTOCOL_VERSION = 2

ParallelNum = Union[int, Literal["auto"]]


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
        coc_cfgs: Mapping[str, Any] | None = None,
        **model: Unpack[ModelSettings],
    ) -> EffectiveConfig:
        """Settle the CoC configuration from the command line, the environment and the model's settings.

        Called on every rank of the TP group with the same arguments: the
        model's settings are the keywords of :class:`ModelSettings` (``tp_size``
        always; the others when the case sets them, defaults in its docs).

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
