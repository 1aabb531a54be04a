"""Main loop of one rank process in a warm pool (``python -m conformance.launchers.worker SPEC``).

Kept free of torch imports at module level so that nothing starts a device
runtime before the pool's device-visibility variables (already in this
process's environment) are in force.
"""

from __future__ import annotations

import pickle
import sys
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

#: Sent to a rank (instead of a case) to make it leave its loop.
STOP = b"stop"


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
    """Initialise the process group once, then run cases until told to stop."""
    conn = Connection(fd)
    import faulthandler
    import signal

    # SIGUSR1 dumps every thread's Python stack; the pool reads it on a hang.
    stack_file = open(stack_path, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    import torch
    import torch.distributed as dist

    from conformance.case import CaseContext, RankOutcome, RemoteError, run_on_rank

    torch.set_num_threads(num_threads)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=collective_timeout_s),
    )
    conn.send_bytes(b"ready")
    try:
        while True:
            message = conn.recv_bytes()
            if message == STOP:
                break
            sys_path, payload, impl_spec, launcher = pickle.loads(message)
            for entry in reversed(sys_path):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            ctx = CaseContext(rank, world_size, device, impl_spec, launcher)
            try:
                fn, params = pickle.loads(payload)
            except Exception as exc:  # noqa: BLE001 - reported as this rank's error
                outcome = RankOutcome(rank, error=RemoteError.capture(exc))
            else:
                outcome = run_on_rank(fn, params, ctx)
            _send_outcome(conn, outcome)
    finally:
        dist.destroy_process_group()


def _send_outcome(conn: Connection, outcome: Any) -> None:
    from conformance.case import RemoteError

    try:
        data = pickle.dumps(outcome)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is the case's error
        outcome.value = None
        outcome.error = RemoteError.capture(TypeError(f"case result cannot be pickled: {exc}"))
        data = pickle.dumps(outcome)
    conn.send_bytes(data)


if __name__ == "__main__":
    import json

    spec = json.loads(sys.argv[1])
    rank_main(spec.pop("rank"), spec.pop("world_size"), spec.pop("fd"), **spec)
