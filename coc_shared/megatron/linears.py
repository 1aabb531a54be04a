"""Megatron's TP linear layers, built on the rank's device and loaded with global weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.distributed as dist

from coc_shared.megatron.placement import active_device, builds_on_device
from coc_shared.megatron.releases import (
    LAYERS_TAKE_TP_GROUP,
    ColumnParallelLinear,
    LinearT,
    ModelParallelConfig,
    ParallelLinear,
    RowParallelLinear,
    layer_tp_group,
    only_megatrons_group,
    parallel_state,
)

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack


def parallel_config(
    *, tp_size: int, sequence_parallel: bool, dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> ModelParallelConfig:
    """A ``ModelParallelConfig`` for standalone TP linear layers.

    ``ModelParallelConfig`` (the type the layers declare) rather than the full
    ``TransformerConfig``: the latter also validates model dimensions (heads,
    hidden size) that a single linear layer does not have.  Weights are
    initialised on ``device`` (default: the enclosing ``model_parallel``'s)
    where megatron can build there, else on the CPU (``use_cpu_initialization``;
    :func:`~coc_shared.megatron.placement.builds_on_device`); gradient-accumulation
    fusion is off (see :func:`build_column`).
    """
    place = active_device() if device is None else torch.device(device)
    return ModelParallelConfig(
        tensor_model_parallel_size=tp_size,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        use_cpu_initialization=not builds_on_device(place),
        perform_initialization=True,
        gradient_accumulation_fusion=False,
    )


def _tp_group(tp_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()


class LinearOptions(TypedDict, total=False):
    """The keywords both TP linears are built with (:func:`build_column`, :func:`build_row`); default in brackets."""

    bias: bool
    """Whether the layer has a bias [True]."""
    sequence_parallel: bool
    """Megatron's sequence parallelism [False]."""
    dtype: torch.dtype
    """The parameters' dtype [float32]."""
    skip_bias_add: bool
    """Return the bias instead of adding it [False]."""
    gradient_accumulation_fusion: bool
    """Accumulate the weight gradient into ``weight.main_grad`` [False]."""
    init_method: Callable[[torch.Tensor], object]
    """Initialises the global weight when none is given [``torch.nn.init.xavier_normal_``]."""
    weight: torch.Tensor | None
    """The *global* weight ``[out, in]`` to load this rank's shard of [None: ``init_method``]."""
    bias_value: torch.Tensor | None
    """The global bias to load [None]."""
    tp_group: dist.ProcessGroup | None
    """The TP group [megatron's]."""
    device: torch.device | str | None
    """Where the layer lives [the enclosing ``model_parallel``'s device]."""


def build_column(
    in_features: int, out_features: int, *, gather_output: bool = False, **options: Unpack[LinearOptions]
) -> ColumnParallelLinear:
    """A real megatron ``ColumnParallelLinear`` (W is ``[out, in]``, sharded on out).

    ``weight`` / ``bias_value`` are the *global* tensors; this rank's shards
    are loaded (:func:`load_global_weights`).  Otherwise ``init_method`` runs
    on the global weight from the torch RNG, so equal seeds give equal layers.
    ``gradient_accumulation_fusion=True`` is set on the layer after
    construction: megatron refuses it at construction without its CUDA
    extension, and the serial megatron backward would still need that
    extension, but the CoC path implements the fusion itself.
    """
    return _build(ColumnParallelLinear, in_features, out_features, options, gather_output=gather_output)


def build_row(
    in_features: int, out_features: int, *, input_is_parallel: bool = True, **options: Unpack[LinearOptions]
) -> RowParallelLinear:
    """A real megatron ``RowParallelLinear`` (W is ``[out, in]``, sharded on in).

    Same conventions as :func:`build_column`; the bias is not sharded.
    """
    return _build(RowParallelLinear, in_features, out_features, options, input_is_parallel=input_is_parallel)


def _build(
    cls: type[LinearT], in_features: int, out_features: int, options: LinearOptions, **layer_options: Any
) -> LinearT:
    """Construct a megatron TP linear of ``cls`` on the TP group and ``device``, loaded with global weights if given.

    Built on the CPU where megatron cannot build on the device, then moved (a
    no-op where it was built there): loading first copies the shards on the host.
    """
    unknown = options.keys() - LinearOptions.__optional_keys__
    if unknown:  # what a spelled-out signature would refuse
        raise TypeError(f"{cls.__name__}: unexpected keyword arguments {sorted(unknown)}")
    group = _tp_group(options.get("tp_group"))
    device = options.get("device")
    place = active_device() if device is None else torch.device(device)
    config = parallel_config(tp_size=group.size(), sequence_parallel=options.get("sequence_parallel", False),
                             dtype=options.get("dtype", torch.float32), device=place)
    layer_options.update(bias=options.get("bias", True), skip_bias_add=options.get("skip_bias_add", False),
                         init_method=options.get("init_method", torch.nn.init.xavier_normal_))
    if LAYERS_TAKE_TP_GROUP:
        layer = cls(in_features, out_features, config=config, tp_group=group, **layer_options)
    else:
        only_megatrons_group(group, cls.__name__)
        layer = cls(in_features, out_features, config=config, **layer_options)
        layer.tp_group = group  # what 0.13+ sets itself; older releases never read it
    layer.gradient_accumulation_fusion = options.get("gradient_accumulation_fusion", False)
    weight = options.get("weight")
    if weight is not None:
        load_global_weights(layer, weight, options.get("bias_value"))
    return layer.to(place)


def load_global_weights(
    layer: ParallelLinear, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> None:
    """Copy this rank's shards of the global ``weight [out, in]`` (and ``bias``) in.

    Column rank ``r`` owns rows ``r*out/tp : (r+1)*out/tp`` of W and the same
    slice of the bias; Row rank ``r`` owns columns ``r*in/tp : (r+1)*in/tp`` of W
    and the whole bias.
    """
    group = layer_tp_group(layer)
    tp, rank = group.size(), group.rank()
    shard_dim = 0 if isinstance(layer, ColumnParallelLinear) else 1
    if weight.dim() != 2 or weight.shape[shard_dim] % tp != 0:
        raise ValueError(
            f"global weight of shape {tuple(weight.shape)} cannot be split {tp} ways along dim "
            f"{shard_dim} for {type(layer).__name__}"
        )
    with torch.no_grad():
        layer.weight.copy_(weight.chunk(tp, dim=shard_dim)[rank])
        if bias is not None:
            if layer.bias is None:
                raise ValueError(f"{type(layer).__name__} was built without a bias")
            layer.bias.copy_(bias.chunk(tp)[rank] if shard_dim == 0 else bias)
