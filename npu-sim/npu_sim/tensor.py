"""The ``npu`` device's tensors: a wrapper on ``npu:0`` around a CPU tensor, every aten op run on the CPU.

An :class:`NpuTensor` is a ``torch.Tensor`` subclass made with ``_make_wrapper_subclass`` on the ``npu``
device (PrivateUse1, renamed), holding the CPU tensor ``raw`` that has its data.  Every aten op reaches
:func:`run` by one of two routes: as the subclass's ``__torch_dispatch__`` (the Python key, after
autograd, autocast and any ``TorchDispatchMode``) and, for ops with no tensor argument (factories with
``device="npu"``), as the PrivateUse1 fallback.  :func:`run` unwraps to ``raw``, runs the op on the CPU and
wraps what it returns, so:

* views share ``raw``'s storage (a view of a view writes through to the base);
* an in-place or ``out=`` op returns the very wrapper it was given (which argument, from the op's schema,
  cached per op), its metadata brought in line with ``raw`` where the op may change it;
* ``untyped_storage()``, ``data_ptr()`` and ``storage_offset()`` answer for ``raw``, so code that compares
  storages to find aliases sees what the device would show;
* ``.cpu()`` / ``.to("cpu")`` return a CPU copy, ``.numpy()`` fails as on any device, pickling carries a CPU
  copy and rebuilds on ``npu`` (torch's own path for storage-less PrivateUse1 tensors);
* an op given a CPU tensor beside npu ones fails, as a device kernel does (CPU scalars, copies and CPU
  indices pass, as torch allows them).

Ops whose behaviour the device changes (GEMMs, collectives, MC2 kernels, random ops' generator) are looked
up in :data:`HANDLERS` / :data:`NAMESPACE_HANDLERS`, which the modules modelling them fill.

Torch's Python device guard knows one device, index 0: every emulated tensor is on ``npu:0``, whatever card
the process selected (see :mod:`npu_sim.runtime`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._mode_utils import no_dispatch

from npu_sim import rng, runtime

Handler = Callable[[Any, tuple, dict], Any]
#: Per-op implementations that replace "run it on ``raw``" (keyed by OpOverload).
HANDLERS: dict[Any, Handler] = {}
#: Per-namespace implementations (``c10d`` collectives, the ``npu`` MC2 kernels).
NAMESPACE_HANDLERS: dict[str, Handler] = {}

_CPU = torch.device("cpu")
#: The device every wrapper reports; set by :func:`install` (``torch.device("npu")`` needs the rename first).
DEVICE: torch.device | None = None


class NpuTensor(torch.Tensor):
    """A tensor on the emulated ``npu`` device; its data is the CPU tensor ``raw``."""

    raw: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, raw: torch.Tensor, requires_grad: bool = False) -> NpuTensor:
        return wrap(raw, requires_grad)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return run(func, args, kwargs or {})

    # --- what the device's storage looks like from Python

    def untyped_storage(self) -> torch.UntypedStorage:
        return self.raw.untyped_storage()

    def data_ptr(self) -> int:
        return self.raw.data_ptr()

    def tolist(self):
        return self.raw.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents=None) -> str:
        # torch prints a subclass under its class name; a device tensor prints as ``tensor(..., device='npu:0')``.
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        prefix = type(self).__name__ + "("
        return "tensor(" + text[len(prefix):].replace("\n" + " " * len(prefix), "\n" + " " * len("tensor("))

    def __reduce_ex__(self, proto):
        # torch's reduction for a device tensor without host-visible storage: a CPU copy, rebuilt on ``npu``
        # when loaded (where the emulator is active, as a real NPU tensor needs torch_npu).
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.raw.detach().clone(), self.dtype, str(self.device), self.requires_grad),
        )

    @property
    def data(self) -> torch.Tensor:
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        torch._C.TensorBase.data.__set__(self, value)
        self.raw = value.raw


def wrap(raw: torch.Tensor, requires_grad: bool = False) -> NpuTensor:
    """A new wrapper on ``npu:0`` whose data is ``raw`` (same shape, strides and offset)."""
    tensor = torch.Tensor._make_wrapper_subclass(
        NpuTensor,
        raw.shape,
        strides=raw.stride(),
        storage_offset=raw.storage_offset(),
        dtype=raw.dtype,
        device=DEVICE,
        requires_grad=requires_grad,
    )
    tensor.raw = raw
    return tensor


def unwrap(value: Any, checked: bool = False) -> Any:
    """``value`` with every wrapper replaced by its ``raw`` and the ``npu`` device by the CPU (lists one level deep).

    ``checked``: refuse a tensor of another device beside npu ones, as a device kernel does (a 0-dim CPU
    tensor passes: torch takes CPU scalars beside device tensors).
    """
    kind = type(value)
    if kind is NpuTensor:
        return value.raw
    if kind is list or kind is tuple:
        return [unwrap(item, checked) for item in value]
    if kind is torch.device:
        return _CPU if value.type == "npu" else value
    if checked and isinstance(value, torch.Tensor) and value.dim():
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{DEVICE} and {value.device}!")
    return value


def unwrap_checked(value: Any) -> Any:
    """:func:`unwrap` refusing a tensor of another device beside npu ones."""
    return unwrap(value, True)


def _wrap_result(value: Any) -> Any:
    kind = type(value)
    if kind is torch.Tensor:
        return wrap(value)
    if kind is tuple or kind is list:
        return kind(_wrap_result(item) for item in value)
    return value


def sync_metadata(tensor: NpuTensor) -> None:
    """Bring a wrapper's sizes, strides and offset in line with ``raw`` after an op changed ``raw``'s."""
    raw = tensor.raw
    if (tensor.shape, tensor.stride(), tensor.storage_offset()) == (raw.shape, raw.stride(), raw.storage_offset()):
        return
    # set_ under the meta dispatch include changes the wrapper's metadata only (torch's own trick for wrapper
    # subclasses, see return_and_correct_aliasing); the source carries storage large enough for the new view.
    source = torch.Tensor._make_wrapper_subclass(
        NpuTensor, raw.shape, strides=raw.stride(), storage_offset=raw.storage_offset(), dtype=raw.dtype, device=DEVICE
    )
    with no_dispatch():
        previous = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            torch.ops.aten.set_.source_Tensor(tensor, source)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(previous)


# --------------------------------------------------------------------------- what each op needs, cached


class _Op:
    """What :func:`run` needs to know about one op, read once from its schema."""

    __slots__ = ("handler", "returns", "sync", "device_arg", "generator", "unwrap")

    def __init__(self, func) -> None:
        schema = func._schema
        self.handler: Handler | None = HANDLERS.get(func) or NAMESPACE_HANDLERS.get(func.namespace)
        arguments = schema.arguments
        # Per return: the (position, name) of the argument it is written into, or None (a new tensor).
        returns: list[tuple[int, str] | None] = []
        for ret in schema.returns:
            alias = ret.alias_info
            source = None
            if alias is not None and alias.is_write:
                source = next(
                    ((i, arg.name) for i, arg in enumerate(arguments)
                     if arg.alias_info is not None and arg.alias_info.before_set == alias.before_set),
                    None,
                )
            returns.append(source)
        self.returns = tuple(returns) if any(r is not None for r in returns) else None
        # Ops that may change a written argument's sizes or strides: inplace views (t_, resize_, set_ ...)
        # and out= variants (which resize their outputs).
        self.sync = self.returns is not None and (
            torch.Tag.inplace_view in func.tags or any(a.kwarg_only and a.alias_info is not None for a in arguments)
        )
        self.device_arg = any(arg.name == "device" for arg in arguments)
        self.generator = next(((i, arg.name, arg.kwarg_only) for i, arg in enumerate(arguments)
                               if str(arg.type) == "Optional[Generator]"), None)
        # Copies cross devices by design, and indexing takes CPU indices; every other op takes npu tensors only.
        self.unwrap = unwrap if func in _ACROSS_DEVICES else unwrap_checked


_OPS: dict[Any, _Op] = {}
_ACROSS_DEVICES = {
    torch.ops.aten.copy_.default, torch.ops.aten._copy_from.default, torch.ops.aten._copy_from_and_resize.default,
    torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
    torch.ops.aten._index_put_impl_.default, torch.ops.aten._unsafe_index.Tensor,
    torch.ops.aten._unsafe_index_put.default,
}


def describe(func) -> _Op:
    op = _OPS.get(func)
    if op is None:
        op = _OPS[func] = _Op(func)
    return op


def _aliased(op: _Op, args: tuple, kwargs: dict, out: Any) -> Any:
    """The op's results with each written argument returned as the wrapper the caller passed."""
    results = []
    for i, source in enumerate(op.returns):
        if source is None:
            results.append(_wrap_result(out[i] if len(op.returns) > 1 else out))
            continue
        position, name = source
        given = args[position] if position < len(args) else kwargs[name]
        if op.sync and type(given) is NpuTensor:
            sync_metadata(given)
        results.append(given)
    return results[0] if len(results) == 1 else tuple(results)


def run(func, args: tuple, kwargs: dict, factory: bool = False) -> Any:
    """Run one aten op on the emulated device (see the module docstring).

    ``factory``: reached through the PrivateUse1 fallback (no npu tensor argument; a CPU one may give a
    shape, as ``empty_like(cpu_tensor, device="npu")``'s does).
    """
    op = _OPS.get(func) or describe(func)
    if runtime.STATE.bad_fork:
        runtime.raise_bad_fork()
    if op.handler is not None:
        return op.handler(func, args, kwargs)
    return run_on_host(func, args, kwargs, factory)


def run_on_host(func, args: tuple, kwargs: dict, factory: bool = False) -> Any:
    """:func:`run` without the op's handler: the op on ``raw``, its results wrapped."""
    op = _OPS.get(func) or describe(func)
    convert = unwrap if factory else op.unwrap
    raw_args = [convert(a) for a in args]
    raw_kwargs = {key: convert(value) for key, value in kwargs.items()} if kwargs else {}
    if op.generator is not None:
        _device_generator(op.generator, raw_args, raw_kwargs)
    out = func(*raw_args, **raw_kwargs)
    if op.returns is not None:
        return _aliased(op, args, kwargs, out)
    if op.device_arg:
        device = kwargs.get("device")
        if device is not None and device.type != "npu":
            return out  # an explicit move to another device (.cpu(), new_empty(device="cpu"))
    return _wrap_result(out)


def _device_generator(spec: tuple[int, str, bool], args: list, kwargs: dict) -> None:
    """Random ops draw from the device's generator (``torch.npu.manual_seed``), not the CPU's."""
    position, name, kwarg_only = spec
    if not kwarg_only and position < len(args):
        if args[position] is None:
            args[position] = rng.generator()
    elif kwargs.get(name) is None:
        kwargs[name] = rng.generator()


def _copy_from(func, args, kwargs):
    """``_copy_from(src, dst)``: how torch copies into a device tensor when the Python key is off (``torch.tensor``)."""
    names = ("self", "dst", "non_blocking")
    bound = dict(zip(names, args), **kwargs)
    source, destination = bound["self"], bound["dst"]
    raw = destination.raw
    if func is torch.ops.aten._copy_from_and_resize.default and raw.shape != source.shape:
        raw.resize_(source.shape)
    raw.copy_(unwrap(source))
    sync_metadata(destination)
    return destination


def _fallback(func, *args, **kwargs):
    """PrivateUse1 kernels of ops with no wrapper argument: factories on ``npu`` start the runtime."""
    device = kwargs.get("device")
    runtime.check_device_index(device.index if device is not None else None)
    return run(func, args, kwargs, factory=True)


_LIBRARIES: list[torch.library.Library] = []


def install(device: torch.device) -> None:
    """Make ``device`` the wrappers' device and register the PrivateUse1 fallback (once per process)."""
    global DEVICE
    DEVICE = device
    if not _LIBRARIES:
        library = torch.library.Library("_", "IMPL")
        library.fallback(_fallback, "PrivateUse1")
        # Copies into a wrapper reach the PrivateUse1 kernel with the Python key excluded (torch.tensor(...,
        # device="npu") does that); torch's Python fallback cannot take a wrapper argument there, a Python
        # kernel registered for the op can.
        copies = torch.library.Library("aten", "IMPL")
        for name, op in (("_copy_from", torch.ops.aten._copy_from.default),
                         ("_copy_from_and_resize", torch.ops.aten._copy_from_and_resize.default)):
            copies.impl(name, lambda *args, _op=op, **kwargs: _copy_from(_op, args, kwargs), "PrivateUse1")
        # The allocations torch.tensor(..., device="npu") makes there too, as kernels of their own: under a
        # TorchDispatchMode torch runs a Python kernel through its per-op registry, which holds no fallback
        # ("func != nullptr" asserted), where a device's C++ kernels just run.
        for name, op in (("empty.memory_format", torch.ops.aten.empty.memory_format),
                         ("empty_strided", torch.ops.aten.empty_strided.default)):
            copies.impl(name, lambda *args, _op=op, **kwargs: _fallback(_op, *args, **kwargs), "PrivateUse1")
        _LIBRARIES.extend([library, copies])  # registrations live as long as the Library objects
    HANDLERS[torch.ops.aten._copy_from.default] = _copy_from
    HANDLERS[torch.ops.aten._copy_from_and_resize.default] = _copy_from
    _OPS.clear()  # handlers may have been added since an op was first described
