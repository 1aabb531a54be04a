"""Route megatron-core's TP linear layers through CoC, reversibly.

:func:`patch_megatron` replaces ``forward`` of megatron's
``ColumnParallelLinear`` and ``RowParallelLinear`` (megatron-core 0.7 to 0.19) for
the duration of a ``with`` block and restores the originals on exit, also
when the block raises.  The replacements keep megatron's signatures
(``functools.wraps``) and its conventions: ``(output, output_bias)`` with
``skip_bias_add``, the column ``weight=`` override and its shape check,
``gather_output`` / ``runtime_gather_output``, ``input_is_parallel``.  Only the
matmul and its collective go to a CoC backend; the choice of backend is made
once, in :func:`backend_for`.

Calls CoC does not cover fall through to megatron's own ``forward``: TP size
1, MoE expert layers (``explicit_expert_comm``), a column layer without a
backward reduction (``disable_grad_reduce`` without SP), deferred embedding
weight-gradients, CPU activation offloading, and weights sharded beyond TP
(0.19's weight rematerialisation, which megatron gathers in its own forward).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from coc_impl import scripted
from coc_impl.block_policy import LayerCallKeywords
from coc_impl.config import CoCConfig
from coc_impl.errors import CoCBackendUnavailable
from coc_shared.megatron import (
    COLUMN_HAS_RUNTIME_GATHER_OUTPUT,
    ColumnParallelLinear,
    RowParallelLinear,
    cpu_device_redirect,
    gather_from_tensor_model_parallel_region,
    layer_tp_group,
    scatter_to_tensor_model_parallel_region,
    weight_sharded_beyond_tp,
)

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack

FUSED_MODULE = "coc_impl.fused"


class LinearBackend(Protocol):
    """What a CoC backend module provides (``coc_impl.scripted``, ``coc_impl.fused``).

    Both take this rank's input and weight shard and return this rank's
    output; ``bias`` (None with ``skip_bias_add``) is added once to the
    final output (after the reduction for the row layer).  Autograd must give
    megatron's gradients, including the gradient-accumulation fusion into
    ``weight.main_grad``.
    """

    def column_forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, **keywords: Unpack[LayerCallKeywords]
    ) -> torch.Tensor: ...

    def row_forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, **keywords: Unpack[LayerCallKeywords]
    ) -> torch.Tensor: ...


def backend_for(config: CoCConfig) -> LinearBackend | ModuleType | None:
    """The single dispatch point: the backend to use, or None for megatron's serial path.

    Fused beats scripted; the scripted form runs when CoC is on with a chunk
    count other than 1 (``customized_coc`` then refines it per matmul).
    """
    if not config.enabled:
        return None
    if config.fused_kernel:
        return _fused_backend()
    if config.scripted:
        return scripted
    return None


def _fused_backend() -> ModuleType:
    try:
        fused = importlib.import_module(FUSED_MODULE)
    except ImportError as exc:
        raise CoCBackendUnavailable(
            f"--coc-fused-kernel: the fused backend ({FUSED_MODULE}) cannot be imported: {exc}"
        ) from exc
    missing = [name for name in ("column_forward", "row_forward") if not hasattr(fused, name)]
    if missing:
        raise CoCBackendUnavailable(
            f"--coc-fused-kernel: {FUSED_MODULE} does not provide {', '.join(missing)}"
        )
    return fused


def _column_uses_coc(layer: ColumnParallelLinear) -> bool:
    return (
        (layer.allreduce_dgrad or layer.sequence_parallel)
        and not layer.explicit_expert_comm
        and not layer.config.defer_embedding_wgrad_compute
        and layer.config._cpu_offloading_context is None
        and not weight_sharded_beyond_tp(layer)
    )


def _row_uses_coc(layer: RowParallelLinear) -> bool:
    return (
        layer_tp_group(layer).size() > 1
        and not layer.explicit_expert_comm
        and layer.config._cpu_offloading_context is None
        and not weight_sharded_beyond_tp(layer)
    )


def _column_forward(original: Callable[..., Any], backend: Any, config: CoCConfig) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self, input_, weight=None, runtime_gather_output=None):
        if not COLUMN_HAS_RUNTIME_GATHER_OUTPUT:
            if runtime_gather_output is not None:  # as megatron before 0.10 refuses it
                raise TypeError("forward() got an unexpected keyword argument 'runtime_gather_output'")
            if not _column_uses_coc(self):
                return original(self, input_, weight)
        elif not _column_uses_coc(self):
            return original(self, input_, weight, runtime_gather_output)
        group = layer_tp_group(self)
        if weight is None:
            if self.weight is None:
                raise RuntimeError(
                    "weight was not supplied to ColumnParallelLinear forward pass "
                    "and skip_weight_param_allocation is True."
                )
            weight = self.weight
        else:
            expected_shape = (self.output_size_per_partition, self.input_size)
            if weight.shape != expected_shape:
                raise RuntimeError(
                    f"supplied weight's shape is {tuple(weight.shape)}, "
                    f"not {expected_shape} as expected"
                )
        output_parallel = backend.column_forward(
            input_, weight, None if self.skip_bias_add else self.bias,
            group=group, sequence_parallel=self.sequence_parallel, config=config,
            gradient_accumulation_fusion=self.gradient_accumulation_fusion,
        )
        gather_output = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather_output:
            output = gather_from_tensor_model_parallel_region(output_parallel, group=group)
        else:
            output = output_parallel
        return output, (self.bias if self.skip_bias_add else None)

    return forward


def _row_forward(original: Callable[..., Any], backend: Any, config: CoCConfig) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self, input_):
        if not _row_uses_coc(self):
            return original(self, input_)
        group = layer_tp_group(self)
        if self.input_is_parallel:
            input_parallel = input_
        else:
            input_parallel = scatter_to_tensor_model_parallel_region(input_, group=group)
        output = backend.row_forward(
            input_parallel, self.weight, None if self.skip_bias_add else self.bias,
            group=group, sequence_parallel=self.sequence_parallel, config=config,
            gradient_accumulation_fusion=self.gradient_accumulation_fusion,
        )
        return output, (self.bias if self.skip_bias_add else None)

    return forward


_PATCHES = {
    ColumnParallelLinear: _column_forward,
    RowParallelLinear: _row_forward,
}


@contextmanager
def patch_megatron(config: CoCConfig) -> Iterator[None]:
    """Within the block, megatron's TP linear layers run CoC as ``config`` says.

    The backend is chosen before anything is patched, so an unavailable
    fused backend raises :class:`~coc_impl.errors.CoCBackendUnavailable` on
    every rank before any collective.  With CoC disabled (or a chunk count of
    1 and no fused kernel) megatron is left untouched.  On CPU the megatron
    device redirect is active for the block.
    """
    backend = backend_for(config)
    if backend is None:
        yield
        return
    originals = {cls: cls.__dict__["forward"] for cls in _PATCHES}
    try:
        for cls, make in _PATCHES.items():
            cls.forward = make(originals[cls], backend, config)
        with cpu_device_redirect():
            yield
    finally:
        for cls, forward in originals.items():
            cls.forward = forward
