"""The reference CoC implementation, as the conformance suite sees it.

A thin facade: configuration comes from :mod:`coc_impl.config`, the fused ops
from :mod:`coc_impl.fused`, the Megatron patch from
:mod:`coc_impl.megatron_patch`.  Other implementations may subclass it and
override single ops (the suite's own fault-injection tests do exactly that).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from coc_impl import errors
from coc_impl.config import CoCConfig, resolve_config
from coc_shared.model_settings import ModelSettings

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack

#: Every phase of every layer: its collective cut into the configured chunks, pipelined.
_CHUNKED = {f"{layer}/{sp}/{phase}": "chunked" for layer, sp, phase in (
    ("column", "nosp", "backward"), ("column", "sp", "forward"), ("column", "sp", "backward"),
    ("row", "nosp", "forward"), ("row", "sp", "forward"), ("row", "sp", "backward"))}


class ReferenceCoC:
    """Scripted and fused CoC on gloo, nccl or hccl (``backend`` picks the fused backend).

    Declares itself to the conformance suite (protocol version 2): its error
    classes, how each layer phase overlaps -- chunked everywhere in the
    scripted form; under the fused kernel the column backward's dx collective
    is one block in flight while the weight-gradient matmul runs (unless
    ``enable_coc_in_column_backward``), the other phases follow the tiling plan
    -- and where its deterministic mode is split-invariant.
    """

    name = "reference"
    protocol_version = 2
    error_types = {
        "config": (errors.CoCChunkCountError, errors.CoCUserCfgError, errors.CoCSettingValueError),
        "incompatible": (errors.CoCWithMC2Error, errors.CoCMoEError, errors.CoCTP2DError,
                         errors.CoCTransformerEngineError, errors.CoCFusedTPError),
        "shape": errors.CoCShapeError,
        "backend_unavailable": errors.CoCBackendUnavailable,
        "argument": errors.CoCArgumentError,
    }
    overlap = _CHUNKED
    fused_overlap = {**_CHUNKED, "column/nosp/backward": "overlaps:weight_grad",
                     "column/sp/backward": "overlaps:weight_grad"}

    def __init__(self, backend: str = "portable") -> None:
        self.backend = backend

    @property
    def split_invariant_ops(self) -> dict[str, tuple[str, ...]]:
        """The deterministic ops, on each device kind whose GEMM was measured to give a row the same bits at any
        row count (:mod:`coc_impl.split_invariance`)."""
        from coc_impl.split_invariance import split_invariant_ops

        return split_invariant_ops()

    def configure(
        self,
        argv: Sequence[str] | None,
        env: Mapping[str, str] | None,
        *,
        coc_cfgs: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        **model: Unpack[ModelSettings],
    ) -> CoCConfig:
        return resolve_config(argv, env, coc_cfgs=coc_cfgs, **model)

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kwargs: Any) -> Any:
        from coc_impl import fused

        return fused.matmul_all_reduce(x, w, bias, backend=self.backend, **kwargs)

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, **kwargs: Any) -> Any:
        from coc_impl import fused

        return fused.matmul_reduce_scatter(x, w, bias, backend=self.backend, **kwargs)

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, **kwargs: Any) -> Any:
        from coc_impl import fused

        return fused.all_gather_matmul(x, w, bias, backend=self.backend, **kwargs)

    def all_gather_matmul_v2(self, x: Any, w: Any, bias: Any = None, **kwargs: Any) -> Any:
        from coc_impl import fused

        return fused.all_gather_matmul_v2(x, w, bias, backend=self.backend, **kwargs)

    def patch_megatron(self, config: CoCConfig) -> AbstractContextManager[Any]:
        from coc_impl.megatron_patch import patch_megatron

        return patch_megatron(config)


class ReferenceCoCAuto(ReferenceCoC):
    """The reference with ``backend="auto"``: every fused call torch_npu's MC² kernels take goes to them, any other
    to the portable backend (``--coc-impl coc_impl.reference:ReferenceCoCAuto`` judges MC² on an NPU node; on
    any other node it is the portable reference)."""

    name = "reference-auto"

    def __init__(self) -> None:
        super().__init__(backend="auto")
