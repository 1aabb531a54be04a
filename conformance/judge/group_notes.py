"""What a numeric failure adds about the process groups the collectives ran on (``docs/DESIGN.md#tp-subgroups``).

The probes resolve each collective's group to global ranks when it runs, and
say whether the group still existed then: a group destroyed since (or left
over from an earlier case) is resolved from the groups seen alive at earlier
recordings, or reported unresolved.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from conformance.contract.results import ObservedCollective


def group_note(collectives: Iterable[ObservedCollective], members: Collection[int], who: str) -> str:
    """``"; <who> issued collectives on ..."`` for groups other than ``members``, gone, or unresolved ("" if none)."""
    seen = list(collectives)
    note = ""
    foreign = sorted({c.group_ranks for c in seen if c.group_ranks is not None and members
                      and set(c.group_ranks) != set(members)})
    if foreign:
        note += (f"; {who} issued collectives on rank group(s) {foreign}, not on the TP group {sorted(members)} "
                 "(a collective over the wrong group)")
    gone = sorted({c.group_ranks for c in seen if c.group_state == "gone" and c.group_ranks is not None})
    if gone:
        note += (f"; {who} issued collectives on process group(s) that no longer existed (destroyed; ranks "
                 f"{gone} while they existed): a stale group, kept from an earlier case or destroyed since")
    unknown = [c for c in seen if c.group_state == "unknown"]
    if unknown:
        note += (f"; {who} issued {len(unknown)} collective(s) ({sorted({c.kind for c in unknown})}) on a process "
                 "group whose ranks could not be resolved (it did not exist at any recording: destroyed before, "
                 "or never registered with torch.distributed)")
    return note
