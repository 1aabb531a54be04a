"""megatron.core's layers running MindSpeed's CoC forward, with the arguments this branch's layers take.

MindSpeed swaps megatron's layer classes for its own (``coc_feature/adaptor.py``);
the protocol patches ``forward`` instead, so each call first runs MindSpeed's
layer ``__init__`` on a weightless shadow (where MindSpeed registers its
settings into the process-global ``min_comm_config``), then MindSpeed's
``forward`` on the megatron layer itself.  What that ``__init__`` takes is read
from its signature: core_r0.18.0 takes ``tp_group`` (and ``use_coc``) and
refuses ``parallel_group``, which the branches before it take.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from conformance.adapters.mindspeed.configuration import MindSpeedConfig
from conformance.adapters.mindspeed.loading import MindSpeed
from conformance.adapters.mindspeed.shims import GLOBAL_ARGS, cpu_device

#: MindSpeed's adaptor, whose ``_resolve_tp_group`` decides a ``tp_group`` layer's group and whether CoC runs.
ADAPTOR = "mindspeed.core.tensor_parallel.coc_feature.adaptor"


def megatron_functions() -> dict[str, Any]:
    """The megatron-core functions ``coc_feature/adaptor.py`` passes to MindSpeed's layer ``__init__``.

    The adaptor itself is not imported for them: on branches before
    core_r0.18.0 it imports ``mindspeed.core.training``, hence all of
    Megatron-LM's training code.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers, mappings
    from megatron.core.utils import divide

    return {
        "_initialize_affine_weight_cpu": layers._initialize_affine_weight_cpu,
        "_initialize_affine_weight_gpu": layers._initialize_affine_weight_gpu,
        "set_tensor_model_parallel_attributes": layers.set_tensor_model_parallel_attributes,
        "get_tensor_model_parallel_group": parallel_state.get_tensor_model_parallel_group,
        "get_tensor_model_parallel_world_size": parallel_state.get_tensor_model_parallel_world_size,
        "get_tensor_model_parallel_rank": parallel_state.get_tensor_model_parallel_rank,
        "gather_from_tensor_model_parallel_region": mappings.gather_from_tensor_model_parallel_region,
        "_reduce": mappings._reduce,
        "_reduce_scatter_along_first_dim": mappings._reduce_scatter_along_first_dim,
        "_gather_along_first_dim": mappings._gather_along_first_dim,
        "divide": divide,
    }


def named_parameters(fn: Callable[..., Any]) -> frozenset[str]:
    """The parameters ``fn`` names (``**kwargs`` is not a name: what it swallows is not "taken")."""
    return frozenset(name for name, p in inspect.signature(fn).parameters.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


@functools.cache
def tp_group_resolver() -> Callable[[dict[str, Any]], tuple[Any, ...]] | None:
    """MindSpeed's ``_resolve_tp_group(kwargs)`` where its adaptor has one and imports, else None."""
    try:
        return getattr(importlib.import_module(ADAPTOR), "_resolve_tp_group", None)
    except Exception:  # noqa: BLE001 - an adaptor that cannot load here has nothing to say
        return None


def group_arguments(taken: frozenset[str], layer: Any) -> dict[str, Any]:
    """The TP group in the form this branch's layer ``__init__`` takes it.

    ``tp_group`` (core_r0.18.0): MindSpeed's own ``_resolve_tp_group`` picks the
    group, whether the CoC path runs (``use_coc``: only on the default TP
    group) and the group getters, as its adaptor does; ``parallel_group``
    (earlier branches): the default TP group, as their adaptor passes it.
    """
    from megatron.core import parallel_state

    group = getattr(layer, "tp_group", None) or parallel_state.get_tensor_model_parallel_group()
    if "tp_group" in taken:
        resolve = tp_group_resolver()
        if resolve is None:
            return {"tp_group": group}
        group, use_coc, get_group, get_world_size, get_rank = resolve({"tp_group": group,
                                                                      "is_expert": layer.is_expert})
        return {"tp_group": group, "use_coc": use_coc, "get_tensor_model_parallel_group": get_group,
                "get_tensor_model_parallel_world_size": get_world_size,
                "get_tensor_model_parallel_rank": get_rank}
    if "parallel_group" in taken:
        return {"parallel_group": parallel_state.get_tensor_model_parallel_group()}
    return {}


def layer_arguments(init: Callable[..., Any], layer: Any, functions: Mapping[str, Any]) -> dict[str, Any]:
    """The injected keyword arguments MindSpeed's layer ``__init__`` names, no more (it may refuse others)."""
    taken = named_parameters(init)
    offered = {**functions, **group_arguments(taken, layer)}
    return {key: value for key, value in offered.items() if key in taken}


def shadow_config(layer: Any, config: MindSpeedConfig) -> Any:
    """The layer's config plus what MindSpeed's patched ``TransformerConfig.__init__`` copies from its args.

    (``coc_mode``, ``coc_parallel_num``, ``coc_fused_kernel``); the shadow
    layer allocates its parameters on the CPU and leaves them uninitialised.
    """
    shadow = copy.copy(layer.config)
    shadow.coc_mode = config.coc_mode
    shadow.coc_parallel_num = config.parallel_num
    shadow.coc_fused_kernel = config.fused_kernel
    shadow.perform_initialization = False
    shadow.use_cpu_initialization = True
    return shadow


def register_layer(ms: MindSpeed, layer: Any, config: MindSpeedConfig, functions: Mapping[str, Any]) -> None:
    """Run MindSpeed's layer ``__init__`` for ``layer`` on a weightless shadow module.

    That ``__init__`` is where MindSpeed registers its settings into the
    process-global ``min_comm_config`` and picks the autograd functions, the
    last layer built winning (``coc_column_parallel_linear.py``); running it
    before each call keeps the global in step with the layer being called.
    What it sets that megatron's layer lacks (``use_coc`` on core_r0.18.0) is
    given to the megatron layer, which MindSpeed's ``forward`` then runs on.
    """
    from megatron.core.tensor_parallel import layers

    common = {"config": shadow_config(layer, config), "init_method": lambda _: None, "bias": False,
              "skip_bias_add": layer.skip_bias_add, "is_expert": layer.is_expert}
    if isinstance(layer, layers.ColumnParallelLinear):
        impl = ms.column_impl
        own = {"gather_output": layer.gather_output, "skip_weight_param_allocation": True,
               "disable_grad_reduce": getattr(layer, "disable_grad_reduce", False)}
    else:
        impl = ms.row_impl
        own = {"input_is_parallel": layer.input_is_parallel}
    shadow = impl(layer.input_size, layer.output_size, **own, **common,
                  **layer_arguments(impl.__init__, layer, functions))
    for name, value in vars(shadow).items():
        if not hasattr(layer, name):
            setattr(layer, name, value)


@contextmanager
def cuda_device_where_mindspeed_runs() -> Iterator[None]:
    """``torch.cuda.current_device()`` -> the NPU's current device while active, as torch_npu's
    ``transfer_to_npu`` answers it where MindSpeed runs Megatron (MindSpeed allocates on it); the CPU where there is
    no NPU; nothing where CUDA is there."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    npu: Any = getattr(torch, "npu", None)
    on_npu = npu is not None and npu.is_available()

    def npu_device(*_: Any) -> Any:
        return torch.device("npu", npu.current_device())

    saved = torch.cuda.current_device
    torch.cuda.current_device = npu_device if on_npu else cpu_device
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def sync_global_args(layer: Any, config: MindSpeedConfig) -> None:
    """``get_args()`` as Megatron-LM would hold it: the parsed args, and the layer's fusion flag.

    MindSpeed reads ``get_args().gradient_accumulation_fusion`` (one global);
    megatron-core keeps the flag per layer, set from the same argument.
    """
    vars(GLOBAL_ARGS).update(vars(config.args))
    GLOBAL_ARGS.gradient_accumulation_fusion = bool(getattr(layer, "gradient_accumulation_fusion", False))


def hands_back_to_megatron(min_comm_config: Any, layer: Any, row: bool) -> bool:
    """When MindSpeed's layer calls ``super().forward`` (megatron's own), as its ``forward`` decides.

    CoC mode 0 without the fused kernel (``--coc-parallel-num 1``, or TP 1),
    for a row layer ``config.coc_row_nocomm``, and a layer MindSpeed keeps off
    its CoC path (``use_coc`` False, or explicit expert communication; core_r0.18.0).
    """
    off = min_comm_config.coc_mode == 0 and not min_comm_config.coc_fused_kernel
    if hasattr(layer, "use_coc"):  # the branches whose layers carry it hand these back too
        off = off or not layer.use_coc or bool(getattr(layer, "explicit_expert_comm", False))
    return off or (row and bool(getattr(layer.config, "coc_row_nocomm", False)))


@contextmanager
def user_cfgs(ms: MindSpeed, cfgs: Mapping[str, Any]) -> Iterator[None]:
    """MindSpeed's ``_COC_CFGS`` (users edit ``user_config.py``) set to ``cfgs`` while active."""
    saved = dict(ms.user_config._COC_CFGS)
    ms.user_config._COC_CFGS.update(cfgs)
    ms.min_comm.min_comm_config.customized_coc_dict = {}  # register_customized_coc only ever adds
    try:
        yield
    finally:
        ms.user_config._COC_CFGS.clear()
        ms.user_config._COC_CFGS.update(saved)
        ms.min_comm.min_comm_config.customized_coc_dict = {}


@contextmanager
def patched_layers(ms: MindSpeed, config: MindSpeedConfig, functions: Mapping[str, Any]) -> Iterator[None]:
    """``forward`` of megatron's ColumnParallelLinear / RowParallelLinear replaced by MindSpeed's.

    Each call registers the layer (:func:`register_layer`), then runs
    MindSpeed's ``CoC*ParallelLinearImpl.forward`` on the megatron layer itself,
    or megatron's saved forward where MindSpeed would call ``super().forward``.
    With CoC off MindSpeed patches nothing (``CoCFeature.is_need_apply``), nor does this.
    """
    from megatron.core.tensor_parallel import layers

    if not config.enabled:
        yield
        return
    global_config = ms.min_comm.min_comm_config
    column_cls: Any = layers.ColumnParallelLinear
    row_cls: Any = layers.RowParallelLinear
    megatron_column, megatron_row = column_cls.__dict__["forward"], row_cls.__dict__["forward"]

    def column_forward(self: Any, input_: Any, weight: Any = None, runtime_gather_output: Any = None,
                       **kwargs: Any) -> Any:
        sync_global_args(self, config)
        register_layer(ms, self, config, functions)
        if hands_back_to_megatron(global_config, self, row=False):
            return megatron_column(self, input_, weight, runtime_gather_output)
        return ms.column_impl.forward(self, input_, weight, runtime_gather_output, **kwargs)

    def row_forward(self: Any, input_: Any, **kwargs: Any) -> Any:
        sync_global_args(self, config)
        register_layer(ms, self, config, functions)
        if hands_back_to_megatron(global_config, self, row=True):
            return megatron_row(self, input_)
        return ms.row_impl.forward(self, input_, **kwargs)

    column_forward.__wrapped__ = megatron_column  # type: ignore[attr-defined]
    row_forward.__wrapped__ = megatron_row  # type: ignore[attr-defined]
    with user_cfgs(ms, config.user_cfgs), cuda_device_where_mindspeed_runs():
        column_cls.forward, row_cls.forward = column_forward, row_forward
        try:
            yield
        finally:
            column_cls.forward, row_cls.forward = megatron_column, megatron_row
