"""The plug-in protocol: what the suite needs from a CoC implementation.

The suite reaches an implementation only through this protocol (selected with
``--coc-impl module:attr``); the reference implementation is just the default.
Only ``name`` and ``configure`` are mandatory.  A missing op, or an op that
raises :class:`NotImplementedError`, is a capability the implementation lacks:
the cases needing it are skipped with that reason, never failed or passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol, Union, runtime_checkable

ParallelNum = Union[int, Literal["auto"]]


@runtime_checkable
class EffectiveConfig(Protocol):
    """The configuration an implementation settled on (see SPEC §2)."""

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

    ``configure`` raises a subclass of the implementation's config error for
    invalid or incompatible settings, identically on every rank and before any
    collective.  ``patch_megatron(config)`` is a context manager replacing (and
    restoring on exit) the forward of megatron.core's ColumnParallelLinear and
    RowParallelLinear.
    """

    name: str

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
    ) -> EffectiveConfig: ...

    def matmul_all_reduce(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
        deterministic: bool = False, antiquant_scale: Any = None, antiquant_offset: Any = None,
        antiquant_group_size: int = 0,
    ) -> Any: ...

    def matmul_reduce_scatter(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
        deterministic: bool = False,
    ) -> Any: ...

    def all_gather_matmul(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
    ) -> Any: ...

    def all_gather_matmul_v2(
        self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
    ) -> tuple[Any, Any]: ...

    def patch_megatron(self, config: EffectiveConfig) -> AbstractContextManager[Any]: ...


#: Capabilities beyond ``configure``; a case names the ones it needs.
CAPABILITIES: tuple[str, ...] = (
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "all_gather_matmul",
    "all_gather_matmul_v2",
    "patch_megatron",
)
