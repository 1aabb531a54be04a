"""A collective's group as global ranks, resolved when it is launched, even once the group is gone.

A group that no longer exists (destroyed, or left over from an earlier case)
is resolved from the groups seen alive at earlier recordings and marked so.
"""

from __future__ import annotations

from typing import Any

#: Group states: resolved while it exists, resolved from an earlier recording (it no longer exists), unknown.
LIVE, GONE, UNKNOWN = "live", "gone", "unknown"
#: Process group name -> its global ranks, for every group seen alive at a recording (groups are named once).
_known_groups: dict[str, tuple[int, ...]] = {}


def remember_live_groups() -> None:
    """Note every group that exists now, so a collective on it after it is destroyed still names its ranks."""
    try:
        import torch.distributed.distributed_c10d as c10d

        for group, ranks in c10d._world.pg_group_ranks.items():
            _known_groups[group.group_name] = tuple(ranks)
    except Exception:  # noqa: BLE001 - no default group yet, or another torch's internals: nothing to remember
        pass


def group_ranks(group: Any) -> tuple[tuple[int, ...] | None, str]:
    """The global ranks of ``group`` (None: WORLD) and whether it still exists (:data:`LIVE` ...)."""
    import torch.distributed as dist

    try:
        if group is None:
            group = dist.group.WORLD
        elif type(group).__name__ == "ScriptObject":
            group = dist.ProcessGroup.unbox(group)
    except Exception:  # noqa: BLE001 - a group we cannot resolve is reported as unknown
        return None, UNKNOWN
    try:
        return tuple(dist.get_process_group_ranks(group)), LIVE
    except Exception:  # noqa: BLE001 - destroyed, or never registered: try the groups seen alive before
        known = _known_groups.get(getattr(group, "group_name", None) or "")
        return known, (GONE if known is not None else UNKNOWN)



def functional_ranks(group_name: str) -> tuple[tuple[int, ...] | None, str]:
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group

        return group_ranks(_resolve_process_group(group_name))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        known = _known_groups.get(group_name)
        return known, (GONE if known is not None else UNKNOWN)
