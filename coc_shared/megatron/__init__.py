"""The one package that talks to megatron-core (0.7 to 0.19), one concern a module.

* :mod:`.releases` -- what differs between releases, detected once, one call each (the table);
* :mod:`.placement` -- where megatron builds and allocates: the rank's device, its RNG tracker;
* :mod:`.parallel` -- megatron's model-parallel state, set up, kept and torn down with its groups;
* :mod:`.linears` -- its TP linear layers, built on the rank's device and loaded with global weights.

Megatron's forward and backward run inside :func:`model_parallel` (or
:func:`cpu_device_redirect`), which puts its buffers on the right device.
Everything else in the project imports megatron's names from here.
"""

from coc_shared.megatron.linears import build_column, build_row, load_global_weights, parallel_config
from coc_shared.megatron.parallel import TensorParallel, model_parallel, release_model_parallel
from coc_shared.megatron.placement import builds_on_device, cpu_device_redirect, device_redirect, megatron_device
from coc_shared.megatron.releases import (
    COLUMN_HAS_RUNTIME_GATHER_OUTPUT,
    ColumnParallelLinear,
    ParallelLinear,
    RowParallelLinear,
    gather_from_tensor_model_parallel_region,
    layer_tp_group,
    scatter_to_tensor_model_parallel_region,
    weight_sharded_beyond_tp,
)

__all__ = [
    "COLUMN_HAS_RUNTIME_GATHER_OUTPUT",
    "ColumnParallelLinear",
    "ParallelLinear",
    "RowParallelLinear",
    "TensorParallel",
    "build_column",
    "build_row",
    "builds_on_device",
    "cpu_device_redirect",
    "device_redirect",
    "gather_from_tensor_model_parallel_region",
    "layer_tp_group",
    "load_global_weights",
    "megatron_device",
    "model_parallel",
    "parallel_config",
    "release_model_parallel",
    "scatter_to_tensor_model_parallel_region",
    "weight_sharded_beyond_tp",
]
