"""Megatron's model-parallel state: set up once for each TP size, kept and switched between, torn down with its
groups."""

from __future__ import annotations

import copy
import types
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


@dataclass
class _Kept:
    """One TP size's parallel state: megatron's module variables as its last block left them, and the process
    groups set up for it (destroyed with it)."""

    variables: dict[str, Any]
    groups: list[Any]
    last_block: int = 0  #: the block (counted in :data:`_blocks`) that last used it


def _variables() -> dict[str, Any]:
    """``parallel_state``'s module variables: every release keeps its whole parallel state in its private globals
    (groups, their ranks and sizes, the memory buffer), which ``initialize_model_parallel`` sets and
    ``destroy_model_parallel`` sets back to ``None``."""
    return {name: value for name, value in vars(parallel_state).items()
            if name.startswith("_") and not name.startswith("__") and not callable(value)
            and not isinstance(value, types.ModuleType)}


def _restore(variables: dict[str, Any]) -> None:
    for name, value in variables.items():
        setattr(parallel_state, name, value)


def _fresh(variables: dict[str, Any]) -> dict[str, Any]:
    """``variables`` with containers of their own (a set-up may fill one in place)."""
    return {name: copy.copy(value) if isinstance(value, (list, dict, set)) else value
            for name, value in variables.items()}


#: ``parallel_state``'s variables before any set-up: no parallel state (what another size's set-up starts from).
_NONE = _fresh(_variables())
#: ``(tp, world size)`` -> its parallel state, kept while the process lives (or until released).
_kept: dict[tuple[int, int], _Kept] = {}
#: The sizes whose state megatron's variables hold now (None: none of ours).
_current: tuple[int, int] | None = None
#: Blocks entered so far (every rank of a pool enters the same blocks, so it counts alike on every rank).
_blocks = 0
#: Blocks of other sizes after which a kept size is released.  Idle gloo groups are not free: each keeps a TCP
#: loop thread using about 0.8 ms of CPU a second, so a pool of 8 ranks keeping three sizes idles on 0.48 of a core
#: against 0.16 with one (measured on the 2-core machine); the suite runs its cases by TP size, so a size left is
#: rarely taken up again but where sizes alternate.
KEEP_BLOCKS = 8


@contextmanager
def model_parallel(
    tp_size: int, *, sequence_parallel: bool = False, seed: int = 1234, keep: bool = True,
    device: torch.device | str = "cpu",
) -> Iterator[TensorParallel]:
    """Megatron's model-parallel state for TP ``tp_size`` over the whole default group, on ``device``.

    Needs an initialised default process group (gloo on CPU) whose world size
    is a multiple of ``tp_size`` (the rest is data parallel); pipeline and
    context parallel sizes are 1.  Initialising it creates a dozen process
    groups (each one collective over the world), a large part of a small
    case's time, so with ``keep`` (default) the state of each TP size is kept:
    a block of another size sets megatron's module variables aside and puts
    back those of its own size (set up once), so ranks whose cases alternate
    between sizes set each up only once (a size unused for
    :data:`KEEP_BLOCKS` blocks is released).  ``keep=False`` (or
    :func:`release_model_parallel`) releases every kept size.  For the whole
    block megatron builds and allocates on ``device`` (the rank's:
    :func:`~coc_shared.megatron.placement.megatron_device`), and where it
    draws weights there, its RNG tracker is seeded with ``seed``.
    """
    if not dist.is_initialized():
        raise RuntimeError("model_parallel needs torch.distributed.init_process_group() first")
    with megatron_device(device) as place:
        _switch((tp_size, dist.get_world_size()))
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


def _switch(sizes: tuple[int, int]) -> None:
    """Make megatron's parallel state that of ``sizes`` (the kept one, or a new one set up from none), and release
    the sizes no block used for :data:`KEEP_BLOCKS` blocks."""
    global _current, _blocks
    _blocks += 1
    if _current is not None and not parallel_state.model_parallel_is_initialized():
        release_model_parallel()  # megatron's state was destroyed under us: release its groups, start afresh
    if _current != sizes:
        _set_aside()
        if sizes in _kept:
            _restore(_kept[sizes].variables)
        else:
            _restore(_fresh(_NONE))
            _kept[sizes] = _Kept({}, _initialize(sizes[0]))
            _kept[sizes].variables = _variables()
        _current = sizes
    _kept[sizes].last_block = _blocks
    for old in [s for s, kept in _kept.items() if _blocks - kept.last_block > KEEP_BLOCKS]:
        _destroy(_kept.pop(old).groups)


def _set_aside() -> None:
    """Keep the current size's variables as its blocks left them (megatron forgets a state set up by someone
    else: it refuses to set up over one)."""
    global _current
    if _current is not None:
        _kept[_current].variables = _variables()
    elif parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    _current = None


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
    """Destroy megatron's parallel state of every kept size and the process groups set up for it (if any)."""
    _set_aside()
    for kept in _kept.values():
        _restore(kept.variables)
        if parallel_state.model_parallel_is_initialized():
            # destroy_model_parallel() only forgets megatron's groups (0.9-0.11 destroy their gloo groups too);
            # destroy the process groups themselves, or every use leaks their threads and sockets.
            parallel_state.destroy_model_parallel()
        _destroy(kept.groups)
    _kept.clear()
    _restore(_fresh(_NONE))
