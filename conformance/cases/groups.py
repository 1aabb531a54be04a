"""TP groups that are a proper subgroup of the world, as in training (DP > 1).

A world of ``W`` ranks is cut into ``W / tp`` TP groups (``docs/DESIGN.md#tp-subgroups``):

* ``contiguous``: ``[0, 1], [2, 3], ...`` -- Megatron's layout (TP innermost);
* ``strided``: ``[0, W/tp, 2W/tp, ...], [1, ...]`` -- a layout where TP ranks
  are not neighbours, as when another parallel dimension is innermost.

The groups of a layout are created once per rank process (every rank of the
world creates every group, in the same order) and reused by later cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.harness.case import RankContext

GROUP_LAYOUTS = ("contiguous", "strided")
#: ``(world size, TP size)`` of the cases whose TP group is a proper subgroup of the world.
SUBGROUP_SIZES: tuple[tuple[int, int], ...] = ((4, 2), (8, 2), (8, 4))
_made: dict[tuple[tuple[int, ...], int, str], list[Any]] = {}


@dataclass(frozen=True)
class TPPlace:
    """Where this rank sits: its TP group, its rank in it, its data-parallel replica."""

    group: Any
    tp_rank: int
    replica: int
    members: tuple[int, ...]  #: the group's ranks in the case's world

    @property
    def tp(self) -> int:
        """The TP size: the group's ranks."""
        return len(self.members)


def tp_layout(world: int, tp: int, layout: str) -> list[list[int]]:
    """The TP groups (ranks of the case's world) of ``layout``."""
    if world % tp:
        raise ValueError(f"a world of {world} cannot be cut into TP groups of {tp}")
    replicas = world // tp
    if layout == "contiguous":
        return [list(range(d * tp, (d + 1) * tp)) for d in range(replicas)]
    if layout == "strided":
        return [list(range(d, world, replicas)) for d in range(replicas)]
    raise ValueError(f"unknown TP layout {layout!r}; known: {GROUP_LAYOUTS}")


def tp_place(ctx: RankContext, tp: int, layout: str = "contiguous") -> TPPlace:
    """This rank's TP group in ``layout`` (the case's whole group when ``tp`` is the world size)."""
    import torch.distributed as dist

    if tp == ctx.world_size:
        return TPPlace(ctx.group, ctx.rank, 0, tuple(range(tp)))
    groups = tp_layout(ctx.world_size, tp, layout)
    world_ranks = tuple(dist.get_process_group_ranks(ctx.group))
    key = (world_ranks, tp, layout)
    if key not in _made:
        local = ctx.subgroup is not None  # torchrun: ranks outside the case do not take part
        _made[key] = [dist.new_group([world_ranks[r] for r in ranks], use_local_synchronization=local)
                      if not local or ctx.rank in ranks else None for ranks in groups]
    replica = next(d for d, ranks in enumerate(groups) if ctx.rank in ranks)
    members = tuple(groups[replica])
    return TPPlace(_made[key][replica], members.index(ctx.rank), replica, members)
