"""What differs between megatron-core releases, hidden behind one call each.

Supported: every minor release from 0.7 to 0.19 (:mod:`coc_shared.megatron_range`
holds the range).  The releases differ in ways this module hides, each detected
once at import from signatures and attributes, never from version strings:

=============================================  ==========  ==========================================
difference                                     from        here
=============================================  ==========  ==========================================
``initialize_model_parallel(create_gloo_       0.12        passed only where accepted (before, megatron
process_groups=)``                                         always builds its gloo groups: harmless)
``parallel_state._global_process_group_list``  0.15        not used: the groups megatron creates are
                                                           recorded while it initialises
layers' ``tp_group=`` and ``layer.tp_group``   0.13        passed where accepted; before, only
                                                           megatron's own TP group, then set on the layer
``mappings.*_region(group=)``                  0.13        :func:`gather_from_tensor_model_parallel_region`
                                                           / :func:`scatter_to_tensor_model_parallel_region`
``ColumnParallelLinear.forward(                0.10        :data:`COLUMN_HAS_RUNTIME_GATHER_OUTPUT`
runtime_gather_output=)``
``pkg_resources`` imported by megatron         0.7-0.8     the environment installs setuptools < 70
``initialize_model_parallel(rank_offset=,      0.17        not passed: one node, the whole world
local_world_size=)``
``initialize_model_parallel`` drops           0.18        never passed
``create_all_gather_group=``
``triton`` imported by ``megatron.core``,      0.18        the environment installs triton;
not declared                                               :mod:`coc_shared.megatron_range` stops without it
``RowParallelLinear.forward`` skips its        0.18        CoC covers TP > 1 only (the patch leaves TP 1
all-reduce at TP 1                                         to megatron on every release)
layers' ``gtp_remat_size``: weights sharded    0.19        :func:`weight_sharded_beyond_tp`; the patch
beyond TP, all-gathered in megatron's forward              leaves such layers to megatron
=============================================  ==========  ==========================================

Where megatron puts its tensors (the rank's device) is
:mod:`coc_shared.megatron.placement`; its parallel state,
:mod:`coc_shared.megatron.parallel`; the layers it builds,
:mod:`coc_shared.megatron.linears`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import torch
import torch.distributed as dist

try:
    from megatron.core import parallel_state
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.tensor_parallel import mappings as _mappings
except ImportError as exc:  # pragma: no cover - depends on the environment
    from coc_shared.megatron_range import SUPPORTED

    raise ImportError(
        f"coc_shared.megatron needs megatron-core {SUPPORTED}: pip install megatron-core ({exc})"
    ) from exc


__all__ = [
    "COLUMN_HAS_RUNTIME_GATHER_OUTPUT", "INIT_TAKES_GLOO_FLAG", "LAYERS_TAKE_TP_GROUP", "ColumnParallelLinear",
    "LinearT", "ModelParallelConfig", "ParallelLinear", "RowParallelLinear", "gather_from_tensor_model_parallel_region",
    "layer_tp_group", "only_megatrons_group", "parallel_state", "scatter_to_tensor_model_parallel_region",
    "weight_sharded_beyond_tp",
]


def _takes(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(fn).parameters


# --- differences between megatron-core releases (the table in the module docstring) ----------------
#: Whether ``initialize_model_parallel`` takes ``create_gloo_process_groups`` (0.12 and later).
INIT_TAKES_GLOO_FLAG = _takes(parallel_state.initialize_model_parallel, "create_gloo_process_groups")
#: Whether the TP layers take ``tp_group`` (0.13 and later).
LAYERS_TAKE_TP_GROUP = all(_takes(cls.__init__, "tp_group") for cls in (ColumnParallelLinear, RowParallelLinear))
_MAPPINGS_TAKE_GROUP = _takes(_mappings.gather_from_tensor_model_parallel_region, "group")
#: Whether ``ColumnParallelLinear.forward`` takes ``runtime_gather_output`` (0.10 and later).
COLUMN_HAS_RUNTIME_GATHER_OUTPUT = _takes(ColumnParallelLinear.forward, "runtime_gather_output")


def only_megatrons_group(group: dist.ProcessGroup | None, what: str) -> None:
    """Before 0.13 layers and mappings use megatron's TP group only: refuse another one."""
    if group is not None and group is not parallel_state.get_tensor_model_parallel_group():
        raise ValueError(f"this megatron-core takes no tp_group for {what}: only megatron's own "
                         "tensor-parallel group (parallel_state) can be used")


def _mapping(name: str, input_: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Megatron's ``mappings.<name>`` on ``group``: passed where the release takes it, else megatron's own only."""
    mapping = getattr(_mappings, name)
    if _MAPPINGS_TAKE_GROUP:
        return mapping(input_, group=group)
    only_megatrons_group(group, name)
    return mapping(input_)


def gather_from_tensor_model_parallel_region(input_: torch.Tensor,
                                             group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's gather along the last dim, with ``group=`` on every release."""
    return _mapping("gather_from_tensor_model_parallel_region", input_, group)


def scatter_to_tensor_model_parallel_region(input_: torch.Tensor,
                                            group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's scatter along the last dim, with ``group=`` on every release."""
    return _mapping("scatter_to_tensor_model_parallel_region", input_, group)


def weight_sharded_beyond_tp(layer: Any) -> bool:
    """Whether ``layer.weight`` is only a part of this rank's TP shard (0.19's ``gtp_remat_size``).

    Megatron all-gathers such a weight inside its own forward and backward;
    CoC needs the whole TP shard, so these layers stay megatron's.
    """
    return int(getattr(layer, "gtp_remat_size", 1)) > 1


def layer_tp_group(layer: Any) -> dist.ProcessGroup:
    """A layer's TP group: ``layer.tp_group`` where set (0.13+, or the harness's builders), else megatron's."""
    group = getattr(layer, "tp_group", None)
    return group if group is not None else parallel_state.get_tensor_model_parallel_group()


ParallelLinear: TypeAlias = ColumnParallelLinear | RowParallelLinear
#: A megatron TP linear class (column- or row-parallel).
LinearT = TypeVar("LinearT", ColumnParallelLinear, RowParallelLinear)
