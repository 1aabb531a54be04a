"""ColossalAI's ring-overlapped sequence-parallel ops behind the plug-in protocol, on CPU.

``--coc-impl conformance.adapters.colossalai:ColossalAIRing`` with ColossalAI
installed, or ``COLOSSALAI_SRC`` naming an unpacked source tree (the root
holding ``colossalai/``, e.g. ``pip download colossalai==0.5.0 --no-deps
--no-binary :all:`` unpacked).  Nothing of ColossalAI is copied here: its
``colossalai/shardformer/layer/_operation.py`` is imported from there and runs
as written, defects included.

What maps onto the protocol (``seq_parallel_mode="ring"``, as ``Linear1D_Col``
and ``Linear1D_Row`` call it; the token dimension is ColossalAI's sequence
dimension, ``dim=1`` of ``[batch=1, tokens, hidden]``):

* ``all_gather_matmul``: ``linear_gather_forward_reducescatter_backward(...,
  ring=True)``, the ring of ``_ring_as_gather`` (one ``batch_isend_irecv`` per
  step, each overlapping the matmul of the shard that arrived before);
* ``all_gather_matmul_v2``: ``_ring_as_gather(F.linear, ...)`` itself, which
  returns the gathered input with the output (the input the ring layer keeps
  for its weight gradient);
* ``matmul_reduce_scatter``: ``linear_reducescatter_forward_gather_backward(...,
  ring=True)`` (``_ring_as_reducescatter``), the bias added after the
  reduce-scatter as ``Linear1D_Row`` does.

Absent (their cases skip): ``matmul_all_reduce`` (ColossalAI has no fused
matmul-all-reduce: ``Linear1D_Row`` without sequence parallelism runs
``F.linear`` then a blocking all-reduce), deterministic mode and explicit
tilings (the ring always takes one step per rank), and ``patch_megatron``
(ColossalAI shards models through its own ``Linear1D_*`` modules, not
megatron.core's layers).  ``configure`` only translates the switch: ColossalAI
has no CoC flags, chunk count or refusals of its own.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

from conformance.adapters.switch_only import SwitchOnlyAdapter

#: Environment variable naming an unpacked ColossalAI source tree (its root, holding ``colossalai/``).
SOURCE_ENV = "COLOSSALAI_SRC"
#: The module holding the ring ops, relative to the source root.
OPERATION_FILE = Path("colossalai", "shardformer", "layer", "_operation.py")
OPERATION_MODULE = "colossalai.shardformer.layer._operation"
#: ColossalAI's sequence dimension in ``[batch, seq, hidden]``: the token rows of the protocol's ``[m, k]``.
SEQ_DIM = 1
_HOW = (f"`pip install colossalai`, or `pip download colossalai==0.5.0 --no-deps --no-binary :all:`, unpack it "
        f"and export {SOURCE_ENV}=<the unpacked colossalai-0.5.0 directory>")


class StandInCalled(NotImplementedError):
    """A stand-in for a ColossalAI import the CPU mapping never needs was called after all."""


# --------------------------------------------------------------------------- loading ColossalAI


def operation_file() -> Path:
    """``_operation.py`` from ``COLOSSALAI_SRC`` or the installed package; an ImportError saying how otherwise."""
    raw = os.environ.get(SOURCE_ENV)
    if raw:
        path = Path(raw).expanduser().resolve() / OPERATION_FILE
        if not path.is_file():
            raise ImportError(f"ColossalAI is not available: {SOURCE_ENV}={raw} has no {OPERATION_FILE}; {_HOW}")
        return path
    spec = importlib.util.find_spec("colossalai")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"ColossalAI is not available: it is not installed and {SOURCE_ENV} is not set; {_HOW}")
    path = Path(next(iter(spec.submodule_search_locations))).parent / OPERATION_FILE
    if not path.is_file():
        raise ImportError(f"ColossalAI at {path.parents[3]} has no {OPERATION_FILE}; {_HOW}")
    return path


def _stand_in(name: str) -> Any:
    def call(*_: Any, **__: Any) -> Any:
        raise StandInCalled(f"{name} is a stand-in of conformance.adapters.colossalai (only the zero-bubble "
                            "pipeline and FP8 communication use it, which this adapter never enables)")

    return call


def _module(name: str, path: Path | None = None, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=path is not None)
    module.__file__ = f"<conformance.adapters.colossalai stand-in for {name}>"
    if path is not None:
        module.__path__ = [str(path)]  # a package whose __init__ (ColossalAI's heavy imports) never runs
    module.__dict__.update(attrs)
    return module


def stand_ins(root: Path) -> dict[str, types.ModuleType]:
    """STAND-INS for the three imports of ``_operation.py`` that pull in ColossalAI's heavy dependencies.

    ``colossalai.pipeline.weight_grad_store`` (``WeightGradStore``, zero-bubble
    pipelines), ``colossalai.shardformer.layer.utils`` (the ``execute_*``
    weight passes of that pipeline, and ``is_share_sp_tp``, copied verbatim)
    and ``colossalai.quantization.fp8`` (FP8 communication).  The ring ops
    reach them only with ``use_zbv=True`` or ``fp8_communication=True``,
    which this adapter never passes; called anyway, they raise
    :class:`StandInCalled`.  The packages above them are empty shells, so
    ColossalAI's package ``__init__`` files (CUDA extensions, transformers...)
    never run.
    """
    layer = root / "colossalai" / "shardformer" / "layer"
    fp8 = ("all_gather_fp8", "all_reduce_fp8", "all_to_all_fp8", "all_to_all_single_fp8", "reduce_scatter_fp8")
    passes = ("execute_conv1d_w_pass", "execute_conv1d_w_pass_grad_accum", "execute_w_pass",
              "execute_w_pass_grad_accum")
    return {
        "colossalai": _module("colossalai", root / "colossalai"),
        "colossalai.shardformer": _module("colossalai.shardformer", root / "colossalai" / "shardformer"),
        "colossalai.shardformer.layer": _module("colossalai.shardformer.layer", layer),
        "colossalai.pipeline": _module("colossalai.pipeline", root / "colossalai" / "pipeline"),
        "colossalai.pipeline.weight_grad_store": _module(
            "colossalai.pipeline.weight_grad_store",
            WeightGradStore=type("WeightGradStore", (), {"put": staticmethod(_stand_in("WeightGradStore.put"))})),
        "colossalai.shardformer.layer.utils": _module(
            "colossalai.shardformer.layer.utils", is_share_sp_tp=lambda mode: mode in ["ring", "split_gather"],
            **{name: _stand_in(name) for name in passes}),
        "colossalai.quantization": _module("colossalai.quantization", root / "colossalai" / "quantization"),
        "colossalai.quantization.fp8": _module("colossalai.quantization.fp8",
                                               **{name: _stand_in(name) for name in fp8}),
    }


@functools.cache
def load_operation() -> types.ModuleType:
    """ColossalAI's ``_operation`` module: the installed one if it imports, else loaded with the stand-ins."""
    if not os.environ.get(SOURCE_ENV):
        try:
            return importlib.import_module(OPERATION_MODULE)
        except ImportError:
            pass  # installed without its dependencies: load the file with the stand-ins below
    path = operation_file()
    for name, module in stand_ins(path.parents[3]).items():
        sys.modules.setdefault(name, module)
    spec = importlib.util.spec_from_file_location(OPERATION_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[OPERATION_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        sys.modules.pop(OPERATION_MODULE, None)
        raise ImportError(f"ColossalAI's {path} cannot be imported ({exc}); {_HOW}") from exc
    return module


# --------------------------------------------------------------------------- the protocol


def _as_sequence(x: Any) -> Any:
    """``[m, k]`` tokens as ColossalAI's ``[batch=1, seq=m, hidden=k]``."""
    return x.unsqueeze(0)


def _linear_weight(w: Any, transpose_weight: bool) -> Any:
    """The protocol's weight as ``F.linear`` takes it, ``[n, k]``."""
    return w if transpose_weight else w.t()


class ColossalAIRing(SwitchOnlyAdapter):
    """ColossalAI's ring all-gather-matmul and matmul-reduce-scatter (``seq_parallel_mode="ring"``) as written."""

    name = "colossalai-ring"

    def __init__(self) -> None:
        self._ops = load_operation()

    def parallel_num(self, tp_size: int) -> int:
        """The ring takes one step per rank."""
        return tp_size

    def all_gather_matmul(self, x: Any, w: Any, bias: Any = None, *, group: Any,
                          transpose_weight: bool = False) -> Any:
        out = self._ops.linear_gather_forward_reducescatter_backward(
            _as_sequence(x), _linear_weight(w, transpose_weight), bias, group, True, SEQ_DIM, ring=True)
        return out.squeeze(0)

    def all_gather_matmul_v2(self, x: Any, w: Any, bias: Any = None, *, group: Any,
                             transpose_weight: bool = False) -> tuple[Any, Any]:
        import torch.nn.functional as F

        out, gathered = self._ops._ring_as_gather(
            F.linear, input_to_gather={"input": _as_sequence(x)},
            input_local={"weight": _linear_weight(w, transpose_weight)}, process_group=group, gather_dim=SEQ_DIM)
        if bias is not None:
            out += bias  # as _LinearWithGatherForwardReduceScatterBackward adds it after the ring
        return out.squeeze(0), gathered["input"].squeeze(0)

    def matmul_reduce_scatter(self, x: Any, w: Any, bias: Any = None, *, group: Any, transpose_weight: bool = False,
                              deterministic: bool = False) -> Any:
        if deterministic:
            raise NotImplementedError("ColossalAI's ring reduce-scatter has no deterministic mode")
        out = self._ops.linear_reducescatter_forward_gather_backward(
            _as_sequence(x), _linear_weight(w, transpose_weight), None, group, SEQ_DIM, ring=True).squeeze(0)
        return out + bias if bias is not None else out  # after the reduce-scatter, as Linear1D_Row adds it
