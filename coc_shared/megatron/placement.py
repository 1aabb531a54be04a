"""Where megatron-core puts its tensors: the rank's device, on every release.

Megatron asks ``torch.cuda`` for its device: ``torch.cuda.current_device()``
is the ``device=`` of the weights it builds with ``use_cpu_initialization``
off, and of the buffers it allocates while it runs (the all-gather buffer of
the SP column forward, the reduce-scatter output of its backward, the outputs
of the ``mappings`` gathers / scatters); weights it initialises on the device
are drawn under its CUDA RNG tracker (``get_cuda_rng_tracker().fork()``),
which ``model_parallel_cuda_manual_seed`` seeds.  So, on every release 0.7 to 0.19:

* the rank's device is made current (on an accelerator);
* where ``torch.cuda`` answers for the rank's device (a CUDA GPU; an NPU
  under torch_npu's ``transfer_to_npu``, as MindSpeed runs megatron), the
  tracker is seeded and megatron builds its weights there itself
  (:func:`builds_on_device`): what users run, with no whole-weight copy on
  the host;
* on any other device (the CPU, an NPU that ``torch.cuda`` does not answer
  for, ``meta`` in tests) megatron could not reach the device through
  ``torch.cuda``: it initialises on the CPU from the CPU generator
  (``use_cpu_initialization``), the module is then moved (``Module.to``
  keeps the parameters and the attributes megatron sets on them), and
  :func:`device_redirect` makes ``torch.cuda.current_device()`` return the
  rank's device, so the buffers megatron allocates meet the inputs there.

Nothing else breaks on a CPU-only torch with gloo (found by running the TP
layers on every release): ``torch.amp.custom_fwd(device_type="cuda")`` is a
no-op without CUDA autocast, and ``gradient_accumulation_fusion`` is refused
by megatron at construction without its CUDA kernel (see
:func:`coc_shared.megatron.linears.build_column`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

#: The device megatron builds on and allocates on (set by :func:`megatron_device`).
_active = threading.local()
_redirect_lock = threading.Lock()
_redirect_depth = 0
_redirected_to: torch.device | None = None
_saved_current_device: Any = None

#: Devices that are never a ``torch.cuda`` device, whatever is installed.
HOST_DEVICES = ("cpu", "meta")


def builds_on_device(device: torch.device) -> bool:
    """Whether megatron builds on ``device`` itself (``torch.cuda`` answers for it) rather than on the CPU."""
    return device.type not in HOST_DEVICES and torch.cuda.is_available()


def active_device() -> torch.device:
    """The device of the enclosing :func:`megatron_device` block (the CPU outside any)."""
    return getattr(_active, "device", None) or torch.device("cpu")


def _current_device() -> torch.device:
    assert _redirected_to is not None
    return _redirected_to


@contextmanager
def device_redirect(device: torch.device | str | None = None) -> Iterator[None]:
    """While active, ``torch.cuda.current_device()`` returns ``device``.

    ``None``: the CPU, or the device of an enclosing redirect.  Reference
    counted, so nested use and one use per threaded rank are safe (all of
    them on one device: a redirect to another one while one is active is
    refused); the original function is restored when the outermost user
    exits, also on exceptions.
    """
    global _redirect_depth, _redirected_to, _saved_current_device
    wanted = None if device is None else torch.device(device)
    with _redirect_lock:
        if _redirect_depth == 0:
            _redirected_to = wanted or torch.device("cpu")
            _saved_current_device = torch.cuda.current_device
            torch.cuda.current_device = _current_device  # type: ignore[assignment]
        elif wanted is not None and wanted != _redirected_to:
            raise RuntimeError(f"megatron's device is redirected to {_redirected_to} already; "
                               f"{wanted} cannot be used in the same process at the same time")
        _redirect_depth += 1
    try:
        yield
    finally:
        with _redirect_lock:
            _redirect_depth -= 1
            if _redirect_depth == 0:
                torch.cuda.current_device = _saved_current_device
                _saved_current_device = _redirected_to = None


@contextmanager
def cpu_device_redirect() -> Iterator[None]:
    """Megatron's buffers on the CPU when there is no CUDA (else a no-op); inside a redirect, on its device."""
    if torch.cuda.is_available():
        yield
        return
    with device_redirect():
        yield


@contextmanager
def megatron_device(device: torch.device | str) -> Iterator[torch.device]:
    """Megatron builds and allocates on ``device`` inside the block (module docstring)."""
    place = torch.device(device)
    before = getattr(_active, "device", None)
    _active.device = place
    try:
        if place.type not in HOST_DEVICES:  # the rank's device is current: its runtime's calls go there
            torch.get_device_module(place.type).set_device(place)
        if builds_on_device(place):
            yield place
        else:
            with device_redirect(place):
                yield place
    finally:
        _active.device = before


def seed_device_rng(device: torch.device, seed: int) -> None:
    """Seed megatron's RNG tracker where it draws weights (on the device); on the CPU it is not used."""
    if builds_on_device(device):
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
