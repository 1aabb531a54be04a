"""``torch.npu`` (also ``torch_npu.npu``): the device module of the emulated node.

The calls torch itself makes on a device module (``is_available``, ``device_count``, ``current_device``,
``manual_seed_all``, ``_is_in_bad_fork``, ``get_amp_supported_dtype`` ...) and the ones torch_npu users
and MindSpeed-style code make: device selection, synchronization, SoC queries, seeds, streams and events.
Which calls start the runtime follows torch_npu (see :mod:`npu_sim.runtime`).

Memory statistics are not modelled: the device's memory is the host's, and tracking every tensor's
storage would cost every op; ``memory_allocated`` and its kin report 0 and ``empty_cache`` has no cache
to empty.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from npu_sim import rng, runtime, streams
from npu_sim.streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream

__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_soc_version",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "memory_allocated",
    "seed",
    "set_device",
    "set_rng_state",
    "set_stream",
    "stream",
    "synchronize",
]


# --------------------------------------------------------------------------- devices and the runtime


def is_available() -> bool:
    return runtime.device_count() > 0


def device_count() -> int:
    return runtime.device_count()


def is_initialized() -> bool:
    return runtime.STATE.started and not runtime.STATE.bad_fork


def init() -> None:
    runtime.start()


_lazy_init = init


def _is_in_bad_fork() -> bool:
    return runtime.STATE.bad_fork


def set_device(device) -> None:
    runtime.set_device(device)


def current_device() -> int:
    return runtime.current_device()


class device:
    """Context manager: ``device`` is the current NPU inside the block."""

    def __init__(self, device) -> None:
        self.index = runtime.device_index(device)
        self.previous: int | None = None

    def __enter__(self) -> None:
        if self.index is not None:
            self.previous = runtime.current_device()
            runtime.set_device(self.index)

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            runtime.set_device(self.previous)


def synchronize(device=None) -> None:
    """Wait for everything queued on the device, collectives included."""
    runtime.check_device_index(runtime.device_index(device))
    streams.synchronize_device()


def get_device_name(device=None) -> str:
    runtime.check_device_index(runtime.device_index(device))
    return runtime.STATE.soc_name


def get_soc_version() -> int:
    runtime.start()
    return runtime.STATE.soc_code


class DeviceProperties(NamedTuple):
    name: str
    total_memory: int
    soc_version: int


def get_device_properties(device=None) -> DeviceProperties:
    runtime.check_device_index(runtime.device_index(device))
    return DeviceProperties(runtime.STATE.soc_name, 64 * 2**30, runtime.STATE.soc_code)


def is_bf16_supported(including_emulation: bool = False) -> bool:
    runtime.start()
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


# --------------------------------------------------------------------------- random numbers


def manual_seed(seed: int) -> None:
    rng.manual_seed(seed)


manual_seed_all = manual_seed


def seed() -> None:
    rng.seed()


seed_all = seed


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device: Any = "npu") -> torch.Tensor:
    return rng.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
    rng.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [rng.get_state()]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    rng.set_state(new_states[0])


# --------------------------------------------------------------------------- streams


def stream(stream: Stream | None) -> StreamContext:
    return StreamContext(stream)


# --------------------------------------------------------------------------- memory (not modelled)


def memory_allocated(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def reset_peak_memory_stats(device=None) -> None:
    """No statistics are kept."""


def empty_cache() -> None:
    """There is no caching allocator to empty."""


class Hooks(torch._C._acc.PrivateUse1Hooks):
    """What torch's C++ side asks the device: built, available, and whether a card's context exists."""

    def is_available(self) -> bool:
        return is_available()

    def is_built(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return runtime.STATE.started


class DeviceGuard(torch._C._acc.DeviceGuard):
    """torch's Python device guard: one device, index 0 (torch 2.13 answers for the rest)."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1
