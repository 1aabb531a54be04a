"""Device leases shared by every pytest-xdist worker on a node, packed onto free devices.

A case needing N devices holds N distinct devices for as long as it runs; an
exclusive case (perf) holds all of them.  On CPU the "devices" are slots:
leasing them caps how many ranks run at once, so ``-n 8`` never oversubscribes.

Requests queue for tickets (``docs/DESIGN.md#leases``): one small state file in
the shared lease directory, read and written under a file lock, records the
queue and who holds which device.  Which waiting request takes devices next
is one rule, :func:`next_grant` (the schedule simulation replays it): the
largest request that fits in the free devices, unless the oldest has waited
:data:`PATIENCE_S` -- then the node drains for it, so a whole-node request is
never starved by smaller ones.  A lease taken is all-or-nothing, so two
workers never hold halves of each other's sets (no deadlock).  Entries of a
process that died (a crashed worker) are dropped by the next process that
reads the state: processes are identified by pid and start time.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock


class LeaseTimeout(TimeoutError):
    """No full set of devices became free in time."""


class LeaseUnsatisfiable(ValueError):
    """The request can never be granted: it wants more devices than the node has."""


#: Shared memory, where the machine has it: a lease rewrites its state file twice a case, and replacing a file on
#: a disk filesystem waits for the disk (ext4: 1 ms a time on a quiet 2-core machine, 16 ms under load, against
#: 0.03 ms in shared memory).
SHARED_MEMORY = Path("/dev/shm")


def default_lease_dir() -> Path:
    """One directory per user and machine, so all workers of a session meet there: in shared memory where the
    machine has it, else in the temp dir."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    base = SHARED_MEMORY if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK) \
        else Path(tempfile.gettempdir())
    return base / f"coc-conformance-leases-{uid}"


def _process_identity(pid: int) -> str | None:
    """``"pid:start-time"``, or None when no such process runs (pid reuse cannot fool it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return f"{pid}:{fields[19]}"  # field 22 of stat: start time in clock ticks
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return f"{pid}:?"


#: How long the oldest waiting request lets larger or later ones that fit go first; then only it may take devices.
PATIENCE_S = 3.0
#: A waiting request looks at the queue again after POLL_MIN_S, then half as long again each time, at most
#: POLL_MAX_S: devices freed are taken that much later (half of it on average).  Cases of the whole node follow
#: each other on every worker (TP 8 on 8 slots), so each hand-over waits for a poll: at 50 ms that was about 9 s
#: of a 90 s run at -n 2; a poll costs a lock and a read of the state, 0.1-0.3 ms of CPU.
POLL_MIN_S, POLL_MAX_S = 0.002, 0.01


def next_poll(waited: float) -> float:
    """When a request that asked at 0 next looks at the queue, at or after ``waited`` seconds (the schedule
    simulation replays the polls through it)."""
    polled, delay = 0.0, POLL_MIN_S
    while polled < waited:
        polled += delay
        delay = min(delay * 1.5, POLL_MAX_S)
    return polled


@dataclass(frozen=True)
class Request:
    """One waiting lease request: its ticket (queue order), how many devices it wants, since when (epoch s)."""

    ticket: int
    wanted: int
    since: float


def next_grant(queue: Sequence[Request], free: int, now: float) -> Request | None:
    """The request of ``queue`` (ticket order) to serve now with ``free`` devices free, or None.

    Packing: the largest request that fits goes first (the oldest of equals),
    so small cases fill the devices around larger ones.  Once the oldest
    request has waited :data:`PATIENCE_S`, only it may go: the node drains
    for it (a whole-node request runs when the node drains, and no request
    waits behind smaller ones for ever).
    """
    if not queue:
        return None
    if now - queue[0].since >= PATIENCE_S:
        return queue[0] if queue[0].wanted <= free else None
    fitting = [r for r in queue if r.wanted <= free]
    return max(fitting, key=lambda r: (r.wanted, -r.ticket), default=None)


class DeviceLeases:
    """Lease distinct devices out of ``devices``, in request order, through ``lease_dir``."""

    def __init__(self, lease_dir: Path, devices: Sequence[str], *, wait_s: float = 1800.0,
                 slots_option: str | None = None) -> None:
        self.lease_dir = Path(lease_dir)
        self.lease_dir.mkdir(parents=True, exist_ok=True)
        self.devices = tuple(devices)
        self.wait_s = wait_s
        self._slots_option = slots_option
        self._lock = FileLock(str(self.lease_dir / "queue.lock"))
        self._state_path = self.lease_dir / "queue.json"
        self._me = _process_identity(os.getpid()) or f"{os.getpid()}:?"

    # ------------------------------------------------------------------ state file

    def _read(self) -> dict[str, Any]:
        try:
            state = json.loads(self._state_path.read_text())
        except (OSError, json.JSONDecodeError):
            state = {}
        state.setdefault("next", 0)
        state.setdefault("queue", [])
        state.setdefault("held", {})
        alive: dict[str, bool] = {}

        def live(owner: str) -> bool:
            if owner not in alive:
                pid = int(owner.split(":", 1)[0])
                identity = _process_identity(pid)
                alive[owner] = identity is not None and (identity == owner or owner.endswith(":?")
                                                         or identity.endswith(":?"))
            return alive[owner]

        state["queue"] = [r for r in state["queue"] if live(r["owner"])]
        # Devices not ours stay held: a session given other cards of the node shares the lease directory.
        state["held"] = {d: h for d, h in state["held"].items() if live(h["owner"])}
        return state

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self._state_path.with_name(f"queue.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_path)

    # ------------------------------------------------------------------ leasing

    @contextlib.contextmanager
    def lease(
        self, count: int, *, exclusive: bool = False, prefer: Sequence[str] = ()
    ) -> Iterator[tuple[str, ...]]:
        """Hold ``count`` distinct devices (all of them if ``exclusive``), in turn.

        A request for more devices than the node has raises
        :class:`LeaseUnsatisfiable` at once, exclusive or not: ranks never
        share a lease slot.

        Devices in ``prefer`` are taken first when free, so a warm pool bound
        to them can be reused.  Yields the leased device names in lease order.
        """
        if count > len(self.devices):
            how = f" (raise {self._slots_option}, or deselect these cases with --coc-tp)" \
                if self._slots_option else ""
            raise LeaseUnsatisfiable(
                f"needs {count} devices, this node has {len(self.devices)} ({', '.join(self.devices)}){how}"
            )
        # An exclusive case holds every device, and still never fewer than it has ranks.
        wanted = len(self.devices) if exclusive else count
        tickets: list[int] = []
        try:
            held = self._wait_for_turn(tickets, wanted, prefer)
        except BaseException:
            if tickets:
                self._leave(tickets[0], ())
            raise
        try:
            yield held
        finally:
            self._leave(tickets[0], held)

    def _wait_for_turn(self, tickets: list[int], wanted: int, prefer: Sequence[str]) -> tuple[str, ...]:
        """Queue a request (its ticket appended to ``tickets``) and wait until it is granted; a request the queue
        grants at once is queued and granted under one hold of the lock (one write of the state)."""
        deadline = time.monotonic() + self.wait_s
        delay = POLL_MIN_S
        while True:
            with self._lock:
                state = self._read()
                queued_now = not tickets
                if queued_now:
                    tickets.append(state["next"])
                    state["next"] += 1
                    state["queue"].append({"ticket": tickets[0], "owner": self._me, "wanted": wanted,
                                           "since": time.time()})
                ticket = tickets[0]
                free = [d for d in self.devices if d not in state["held"]]
                queue = [Request(r["ticket"], r["wanted"], r["since"]) for r in state["queue"]]
                chosen = next_grant(queue, len(free), time.time())
                if chosen is not None and chosen.ticket == ticket:
                    order = [d for d in prefer if d in free] + [d for d in free if d not in prefer]
                    held = tuple(order[:wanted])
                    for device in held:
                        state["held"][device] = {"owner": self._me, "ticket": ticket}
                    state["queue"] = [r for r in state["queue"] if r["ticket"] != ticket]
                    self._write(state)
                    return held
                if queued_now:
                    self._write(state)  # queued, waiting for its turn
                if time.monotonic() > deadline:
                    ahead = [r["ticket"] for r in state["queue"] if r["ticket"] < ticket]
                    raise LeaseTimeout(f"no {wanted} free devices within {self.wait_s:g} s "
                                       f"({len(ahead)} request(s) ahead, held: {sorted(state['held'])})")
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX_S)

    def _leave(self, ticket: int, held: Sequence[str]) -> None:
        with self._lock:
            state = self._read()
            state["queue"] = [r for r in state["queue"] if r["ticket"] != ticket]
            for device in held:
                if state["held"].get(device, {}).get("ticket") == ticket:
                    del state["held"][device]
            self._write(state)
