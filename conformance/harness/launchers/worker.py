"""Main loop of one rank process in a warm pool.

Started by the zygote (:mod:`conformance.harness.launchers.zygote`) after it
forked, or as ``python -m conformance.harness.launchers.worker <json>`` where no
zygote runs.  Kept free of torch imports at module level so that nothing
starts a device runtime before the pool's device-visibility variables are in
force.

Messages to the pool start with one tag byte: :data:`READY` once the process
group is up, :data:`LOADED` once the implementation is loaded for a task (its
budget does not count the load), :data:`BUDGET` + seconds when the running
task sets its budget, :data:`PROGRESS` + a count when the task's recorded
collectives complete (at most every :data:`PROGRESS_EVERY_S`), :data:`RESULT` + the pickled
:class:`~conformance.harness.case.RankOutcome`.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

#: Sent to a rank (instead of a task) to make it leave its loop.
STOP = b"stop"
READY, LOADED, BUDGET, PROGRESS, RESULT = b"Y", b"L", b"B", b"P", b"R"
#: The shortest interval between two progress messages of a rank (a budget is seconds long).
PROGRESS_EVERY_S = 0.2


def rank_main(
    rank: int,
    world_size: int,
    fd: int,
    *,
    store_path: str,
    backend: str,
    stack_path: str,
    device: str,
    collective_timeout_s: float,
    num_threads: int,
) -> None:
    """Initialise the process group once, then run tasks until told to stop (or the pool goes away)."""
    conn = Connection(fd)
    import faulthandler
    import signal

    # SIGUSR1 dumps every thread's Python stack; the pool reads it on a hang.
    stack_file = open(stack_path, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    import torch
    import torch.distributed as dist

    from conformance.harness.case import CapturedError, RankContext, RankOutcome, run_on_rank
    from conformance.harness.impl_loader import preload_implementation

    torch.set_num_threads(num_threads)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=collective_timeout_s),
    )
    conn.send_bytes(READY)

    def on_budget(seconds: float) -> None:
        conn.send_bytes(BUDGET + repr(seconds).encode())

    from conformance.harness import probes

    probes.COMPLETED.listener = _Throttled(lambda count: conn.send_bytes(PROGRESS + str(count).encode()))

    try:
        while True:
            try:
                message = conn.recv_bytes()
            except EOFError:
                break  # the pool is gone
            if message == STOP:
                break
            sys_path, payload, impl_spec, launcher, budget = pickle.loads(message)
            for entry in reversed(sys_path):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            preload_implementation(impl_spec)
            conn.send_bytes(LOADED)
            ctx = RankContext(rank, world_size, device, impl_spec, launcher, on_budget=on_budget, budget=budget)
            try:
                fn, params = pickle.loads(payload)
            except Exception as exc:  # noqa: BLE001 - reported as this rank's error
                outcome = RankOutcome(rank, error=CapturedError.capture(exc))
            else:
                outcome = run_on_rank(fn, params, ctx)
            _send_outcome(conn, outcome)
    finally:
        dist.destroy_process_group()


class _Throttled:
    """Calls ``send`` with the latest count, at most every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, send: Callable[[int], None]) -> None:
        self.send, self._last = send, 0.0

    def __call__(self, count: int) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_EVERY_S:
            self._last = now
            self.send(count)


def _send_outcome(conn: Connection, outcome: Any) -> None:
    from conformance.harness.case import CapturedError

    try:
        data = pickle.dumps(outcome)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is the task's error
        outcome.value = None
        outcome.error = CapturedError.capture(TypeError(f"task result cannot be pickled: {exc}"))
        data = pickle.dumps(outcome)
    conn.send_bytes(RESULT + data)


if __name__ == "__main__":
    import json

    spec = json.loads(sys.argv[1])
    rank_main(spec.pop("rank"), spec.pop("world_size"), spec.pop("fd"), **spec)
