"""The one place that talks to megatron-core: CPU redirection, groups, layers, release differences.

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

What breaks when these tensor-parallel layers run on a CPU-only torch with
gloo (found by running them on every release): only
``torch.cuda.current_device()``, which megatron uses as the ``device=`` of the
buffers it allocates (the global all-gather buffer of the SP column forward,
the reduce-scatter output of the SP column backward, the outputs of the
``mappings`` gathers / scatters).  On a torch without CUDA it raises
"Torch not compiled with CUDA enabled".  :func:`cpu_device_redirect` makes it
return ``torch.device("cpu")`` for as long as it is active and nothing else.

Not needed on CPU, hence not touched: megatron's CUDA RNG tracker (layers built
with ``use_cpu_initialization=True`` draw their weights from the CPU generator),
``torch.amp.custom_fwd(device_type="cuda")`` (a no-op without CUDA autocast) and
``gradient_accumulation_fusion`` (its CUDA kernel is absent; megatron refuses
the flag at construction, see :func:`build_column`).

Megatron's forward and backward must run while the redirect is active:
inside :func:`model_parallel` (or :func:`cpu_device_redirect`).  Everything
else in ``coc_impl`` imports megatron names from here.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
        f"coc_shared.megatron_harness needs megatron-core {SUPPORTED}: pip install megatron-core ({exc})"
    ) from exc


def _takes(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(fn).parameters


# --- differences between megatron-core releases (the table in the module docstring) ----------------
_INIT_TAKES_GLOO_FLAG = _takes(parallel_state.initialize_model_parallel, "create_gloo_process_groups")
_LAYERS_TAKE_TP_GROUP = all(_takes(cls.__init__, "tp_group") for cls in (ColumnParallelLinear, RowParallelLinear))
_MAPPINGS_TAKE_GROUP = _takes(_mappings.gather_from_tensor_model_parallel_region, "group")
#: Whether ``ColumnParallelLinear.forward`` takes ``runtime_gather_output`` (0.10 and later).
COLUMN_HAS_RUNTIME_GATHER_OUTPUT = _takes(ColumnParallelLinear.forward, "runtime_gather_output")


def _only_megatrons_group(group: dist.ProcessGroup | None, what: str) -> None:
    """Before 0.13 layers and mappings use megatron's TP group only: refuse another one."""
    if group is not None and group is not parallel_state.get_tensor_model_parallel_group():
        raise ValueError(f"this megatron-core takes no tp_group for {what}: only megatron's own "
                         "tensor-parallel group (parallel_state) can be used")


def gather_from_tensor_model_parallel_region(input_: torch.Tensor,
                                             group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's gather along the last dim, with ``group=`` on every release."""
    if _MAPPINGS_TAKE_GROUP:
        return _mappings.gather_from_tensor_model_parallel_region(input_, group=group)
    _only_megatrons_group(group, "gather_from_tensor_model_parallel_region")
    return _mappings.gather_from_tensor_model_parallel_region(input_)


def scatter_to_tensor_model_parallel_region(input_: torch.Tensor,
                                            group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's scatter along the last dim, with ``group=`` on every release."""
    if _MAPPINGS_TAKE_GROUP:
        return _mappings.scatter_to_tensor_model_parallel_region(input_, group=group)
    _only_megatrons_group(group, "scatter_to_tensor_model_parallel_region")
    return _mappings.scatter_to_tensor_model_parallel_region(input_)


def weight_sharded_beyond_tp(layer: Any) -> bool:
    """Whether ``layer.weight`` is only a part of this rank's TP shard (0.19's ``gtp_remat_size``).

    Megatron all-gathers such a weight inside its own forward and backward;
    CoC needs the whole TP shard, so these layers stay megatron's.
    """
    return int(getattr(layer, "gtp_remat_size", 1)) > 1


def layer_tp_group(layer: Any) -> dist.ProcessGroup:
    """A layer's TP group: ``layer.tp_group`` where set (0.13+, or :func:`build_column`), else megatron's."""
    group = getattr(layer, "tp_group", None)
    return group if group is not None else parallel_state.get_tensor_model_parallel_group()

__all__ = [
    "COLUMN_HAS_RUNTIME_GATHER_OUTPUT",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "ParallelLinear",
    "TensorParallel",
    "build_column",
    "build_row",
    "cpu_device_redirect",
    "gather_from_tensor_model_parallel_region",
    "layer_tp_group",
    "load_global_weights",
    "model_parallel",
    "release_model_parallel",
    "parallel_config",
    "scatter_to_tensor_model_parallel_region",
    "weight_sharded_beyond_tp",
]

ParallelLinear: TypeAlias = ColumnParallelLinear | RowParallelLinear
#: A megatron TP linear class (column- or row-parallel).
LinearT = TypeVar("LinearT", ColumnParallelLinear, RowParallelLinear)

_redirect_lock = threading.Lock()
_redirect_depth = 0
_saved_current_device: Any = None


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


@contextmanager
def cpu_device_redirect() -> Iterator[None]:
    """While active, ``torch.cuda.current_device()`` returns the CPU device.

    Only when CUDA is unavailable (otherwise a no-op).  Reference counted, so
    nested use and one use per threaded rank are safe; the original function
    is restored when the outermost user exits, also on exceptions.
    """
    global _redirect_depth, _saved_current_device
    if torch.cuda.is_available():
        yield
        return
    with _redirect_lock:
        if _redirect_depth == 0:
            _saved_current_device = torch.cuda.current_device
            torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]
        _redirect_depth += 1
    try:
        yield
    finally:
        with _redirect_lock:
            _redirect_depth -= 1
            if _redirect_depth == 0:
                torch.cuda.current_device = _saved_current_device
                _saved_current_device = None


@dataclass(frozen=True)
class TensorParallel:
    """The tensor-parallel group set up by :func:`model_parallel`."""

    size: int
    rank: int
    group: dist.ProcessGroup
    sequence_parallel: bool
    data_parallel_rank: int = 0  #: the replica this rank belongs to (worlds larger than TP)


#: ``(tp, world size)`` of the parallel state this module initialised and keeps (None: none).
_kept: tuple[int, int] | None = None
#: The process groups megatron created for it (destroyed with it).
_kept_groups: list[Any] = []


@contextmanager
def model_parallel(
    tp_size: int, *, sequence_parallel: bool = False, seed: int = 1234, keep: bool = True,
) -> Iterator[TensorParallel]:
    """Megatron's model-parallel state for TP ``tp_size`` over the whole default group.

    Needs an initialised default process group (gloo on CPU) whose world size
    is a multiple of ``tp_size`` (the rest is data parallel); pipeline and
    context parallel sizes are 1.  Initialising it creates a dozen process
    groups, a large part of a small case's time, so with ``keep`` (default)
    the state stays for the next block of the same sizes and is released only
    when other sizes are asked for (or by :func:`release_model_parallel`).
    On CUDA the megatron RNG tracker is seeded (tensor-parallel dropout and GPU
    weight initialisation need it); on CPU neither is used.  The CPU device
    redirect is active for the whole block.
    """
    global _kept
    if not dist.is_initialized():
        raise RuntimeError("model_parallel needs torch.distributed.init_process_group() first")
    sizes = (tp_size, dist.get_world_size())
    with cpu_device_redirect():
        if _kept != sizes or not parallel_state.model_parallel_is_initialized():
            release_model_parallel()
            _kept_groups[:] = _initialize(tp_size)
            _kept = sizes
        try:
            if torch.cuda.is_available():
                from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

                model_parallel_cuda_manual_seed(seed)
            yield TensorParallel(
                size=parallel_state.get_tensor_model_parallel_world_size(),
                rank=parallel_state.get_tensor_model_parallel_rank(),
                group=parallel_state.get_tensor_model_parallel_group(),
                sequence_parallel=sequence_parallel,
                data_parallel_rank=parallel_state.get_data_parallel_rank(),
            )
        finally:
            if not keep:
                release_model_parallel()


def _initialize(tp_size: int) -> list[Any]:
    """``initialize_model_parallel`` on any release; returns the process groups it created.

    Every release creates its groups through ``torch.distributed.new_group``,
    so they are recorded there (only 0.15+ keeps a list of its own).
    """
    kwargs: dict[str, Any] = {"tensor_model_parallel_size": tp_size}
    if _INIT_TAKES_GLOO_FLAG:
        # Megatron's extra gloo groups serve its distributed optimizer and checkpointing, not the TP layers.
        kwargs["create_gloo_process_groups"] = False
    created: list[Any] = []
    real_new_group = dist.new_group

    def recording_new_group(*args: Any, **kw: Any) -> Any:
        group = real_new_group(*args, **kw)
        created.append(group)
        return group

    dist.new_group = recording_new_group
    try:
        parallel_state.initialize_model_parallel(**kwargs)
    except BaseException:
        dist.new_group = real_new_group
        parallel_state.destroy_model_parallel()
        _destroy(created)
        raise
    dist.new_group = real_new_group
    return created


def _destroy(groups: list[Any]) -> None:
    """Destroy the groups still registered (0.9-0.11 destroy their gloo groups themselves)."""
    alive = dist.distributed_c10d._world.pg_map
    for group in groups:
        if isinstance(group, dist.ProcessGroup) and group in alive:
            dist.destroy_process_group(group)


def release_model_parallel() -> None:
    """Destroy megatron's parallel state and the process groups it created (if any)."""
    global _kept
    _kept = None
    if parallel_state.model_parallel_is_initialized():
        # destroy_model_parallel() only forgets megatron's groups; destroy the
        # process groups themselves too, or every use leaks their threads and sockets.
        parallel_state.destroy_model_parallel()
    _destroy(_kept_groups)
    _kept_groups.clear()


def parallel_config(
    *, tp_size: int, sequence_parallel: bool, dtype: torch.dtype = torch.float32
) -> ModelParallelConfig:
    """A ``ModelParallelConfig`` for standalone TP linear layers.

    ``ModelParallelConfig`` (the type the layers declare) rather than the full
    ``TransformerConfig``: the latter also validates model dimensions (heads,
    hidden size) that a single linear layer does not have.  Weights are
    initialised on the CPU when CUDA is absent (``use_cpu_initialization``),
    on the current GPU otherwise; gradient-accumulation fusion is off (see
    :func:`build_column`).
    """
    return ModelParallelConfig(
        tensor_model_parallel_size=tp_size,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=True,
        gradient_accumulation_fusion=False,
    )


def _tp_group(tp_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()


def build_column(
    in_features: int,
    out_features: int,
    *,
    bias: bool = True,
    sequence_parallel: bool = False,
    dtype: torch.dtype = torch.float32,
    gather_output: bool = False,
    skip_bias_add: bool = False,
    gradient_accumulation_fusion: bool = False,
    init_method: Callable[[torch.Tensor], object] = torch.nn.init.xavier_normal_,
    weight: torch.Tensor | None = None,
    bias_value: torch.Tensor | None = None,
    tp_group: dist.ProcessGroup | None = None,
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
    return _build(
        ColumnParallelLinear, in_features, out_features, sequence_parallel, dtype,
        gradient_accumulation_fusion, weight, bias_value, tp_group,
        init_method=init_method, bias=bias, gather_output=gather_output, skip_bias_add=skip_bias_add,
    )


def build_row(
    in_features: int,
    out_features: int,
    *,
    bias: bool = True,
    sequence_parallel: bool = False,
    dtype: torch.dtype = torch.float32,
    input_is_parallel: bool = True,
    skip_bias_add: bool = False,
    gradient_accumulation_fusion: bool = False,
    init_method: Callable[[torch.Tensor], object] = torch.nn.init.xavier_normal_,
    weight: torch.Tensor | None = None,
    bias_value: torch.Tensor | None = None,
    tp_group: dist.ProcessGroup | None = None,
) -> RowParallelLinear:
    """A real megatron ``RowParallelLinear`` (W is ``[out, in]``, sharded on in).

    Same conventions as :func:`build_column`; the bias is not sharded.
    """
    return _build(
        RowParallelLinear, in_features, out_features, sequence_parallel, dtype,
        gradient_accumulation_fusion, weight, bias_value, tp_group,
        init_method=init_method, bias=bias, input_is_parallel=input_is_parallel, skip_bias_add=skip_bias_add,
    )


def _build(
    cls: type[LinearT],
    in_features: int,
    out_features: int,
    sequence_parallel: bool,
    dtype: torch.dtype,
    gradient_accumulation_fusion: bool,
    weight: torch.Tensor | None,
    bias_value: torch.Tensor | None,
    tp_group: dist.ProcessGroup | None,
    **layer_options: Any,
) -> LinearT:
    """Construct a megatron TP linear of ``cls`` on the TP group and load global weights if given."""
    group = _tp_group(tp_group)
    config = parallel_config(tp_size=group.size(), sequence_parallel=sequence_parallel, dtype=dtype)
    if _LAYERS_TAKE_TP_GROUP:
        layer = cls(in_features, out_features, config=config, tp_group=group, **layer_options)
    else:
        _only_megatrons_group(group, cls.__name__)
        layer = cls(in_features, out_features, config=config, **layer_options)
        layer.tp_group = group  # what 0.13+ sets itself; older releases never read it
    layer.gradient_accumulation_fusion = gradient_accumulation_fusion
    if weight is not None:
        load_global_weights(layer, weight, bias_value)
    return layer


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
