"""Megatron's model-parallel state: set up once for a TP size, kept while it fits, torn down with its groups."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from coc_shared.megatron.placement import megatron_device, seed_device_rng
from coc_shared.megatron.releases import INIT_TAKES_GLOO_FLAG, parallel_state


@dataclass(frozen=True)
class TensorParallel:
    """The tensor-parallel group set up by :func:`model_parallel`."""

    size: int
    rank: int
    group: dist.ProcessGroup
    sequence_parallel: bool
    data_parallel_rank: int = 0  #: the replica this rank belongs to (worlds larger than TP)
    #: Where megatron builds this rank's layers and allocates its buffers.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


#: ``(tp, world size)`` of the parallel state this module initialised and keeps (None: none).
_kept: tuple[int, int] | None = None
#: The process groups megatron created for it (destroyed with it).
_kept_groups: list[Any] = []


@contextmanager
def model_parallel(
    tp_size: int, *, sequence_parallel: bool = False, seed: int = 1234, keep: bool = True,
    device: torch.device | str = "cpu",
) -> Iterator[TensorParallel]:
    """Megatron's model-parallel state for TP ``tp_size`` over the whole default group, on ``device``.

    Needs an initialised default process group (gloo on CPU) whose world size
    is a multiple of ``tp_size`` (the rest is data parallel); pipeline and
    context parallel sizes are 1.  Initialising it creates a dozen process
    groups, a large part of a small case's time, so with ``keep`` (default)
    the state stays for the next block of the same sizes and is released only
    when other sizes are asked for (or by :func:`release_model_parallel`).
    For the whole block megatron builds and allocates on ``device`` (the
    rank's: :func:`~coc_shared.megatron.placement.megatron_device`), and where
    it draws weights there, its RNG tracker is seeded with ``seed``.
    """
    global _kept
    if not dist.is_initialized():
        raise RuntimeError("model_parallel needs torch.distributed.init_process_group() first")
    sizes = (tp_size, dist.get_world_size())
    with megatron_device(device) as place:
        if _kept != sizes or not parallel_state.model_parallel_is_initialized():
            release_model_parallel()
            _kept_groups[:] = _initialize(tp_size)
            _kept = sizes
        try:
            seed_device_rng(place, seed)
            yield TensorParallel(
                size=parallel_state.get_tensor_model_parallel_world_size(),
                rank=parallel_state.get_tensor_model_parallel_rank(),
                group=parallel_state.get_tensor_model_parallel_group(),
                sequence_parallel=sequence_parallel,
                data_parallel_rank=parallel_state.get_data_parallel_rank(),
                device=place,
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
    if INIT_TAKES_GLOO_FLAG:
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
    # gloo's full mesh may return on one rank before a peer has finished taking its connections, and a group
    # destroyed then (the next size's release) fails the peer's ("Connection closed by peer"): no rank goes on
    # until every rank has joined every group.
    dist.barrier()
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
