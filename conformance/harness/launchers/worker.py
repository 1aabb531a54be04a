"""Main loop of one rank process in a warm pool.

Started by the zygote (:mod:`conformance.harness.launchers.zygote`) after it
forked, or as ``python -m conformance.harness.launchers.worker <json>`` where no
zygote runs.  Kept free of torch imports at module level so that nothing
starts a device runtime before the pool's device-visibility variables are in
force.

Messages to the pool start with one tag byte: :data:`READY` once the process
group is up (on HCCL and NCCL, once its first collective has completed:
:func:`create_communicators`), :data:`LOADED` once the implementation is loaded for a task (its
budget does not count the load), :data:`BUDGET` + seconds when the running
task sets its budget, :data:`PROGRESS` + the rank's evidence of progress as
JSON (:class:`~conformance.harness.progress.Evidence`: collectives completed,
stack changes, device work completed, whether it waits in a collective; sent
by a sampling thread whenever it changed, so the latest always arrives),
:data:`RESULT` + the pickled :class:`~conformance.harness.case.RankOutcome`.
Every message is sent under one lock (the sampler sends from its own thread).
"""

from __future__ import annotations

import json
import pickle
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

#: Sent to a rank (instead of a task) to make it leave its loop.
STOP = b"stop"
READY, LOADED, BUDGET, PROGRESS, RESULT = b"Y", b"L", b"B", b"P", b"R"
#: The key of a rank outcome's timings under which the rank's process CPU time for the task is recorded (all its
#: threads: the task's, the backend's, the sampler's), what the task asked of the node's cores.
CPU = "cpu"


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

    # SIGUSR1 dumps every thread's Python stack; the pool reads it on a hang. A fatal signal (SIGSEGV,
    # SIGABRT, ...) dumps them there too, so a rank that dies says where.
    stack_file = open(stack_path, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file, all_threads=True)

    import torch
    import torch.distributed as dist

    from conformance.contract.rank_errors import CapturedError
    from conformance.harness.case import RankContext, RankOutcome, run_on_rank
    from conformance.harness.impl_loader import preload_implementation
    from conformance.harness.launchers import devices

    torch.set_num_threads(num_threads)
    devices.bind_device(device)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=collective_timeout_s),
    )
    create_communicators(backend, device, world_size)
    conn.send_bytes(READY)

    from conformance.harness.case_clock import sampling_starts
    from conformance.harness.completions import COMPLETED
    from conformance.harness.probes.waits import count_completions
    from conformance.harness.progress import Reporter, TaskSampler

    lock = threading.Lock()

    def send(message: bytes) -> None:
        with lock:
            conn.send_bytes(message)

    def on_budget(seconds: float) -> None:
        send(BUDGET + repr(seconds).encode())
        reporter.sample_from(sampling_starts(seconds))

    count_completions()  # every collective completing is evidence, recorded or not
    reporter = Reporter(lambda e: conn.send_bytes(PROGRESS + json.dumps(e.as_json()).encode()), lock)
    task_thread = threading.get_ident()

    try:
        while True:
            try:
                message = conn.recv_bytes()
            except EOFError:
                break  # the pool is gone
            if message == STOP:
                break
            sys_path, payload, impl_spec, launcher, budget, device_thread_backward = pickle.loads(message)
            for entry in reversed(sys_path):
                if entry not in sys.path:
                    sys.path.insert(0, entry)
            preload_implementation(impl_spec)
            send(LOADED)
            reporter.start(TaskSampler(task_thread, _completed_since(COMPLETED.count), device,
                                       whole_process=True))
            ctx = RankContext(rank, world_size, device, impl_spec, launcher, on_budget=on_budget, budget=budget,
                              device_thread_backward=device_thread_backward)
            cpu_begun = time.process_time()
            try:
                fn, params = pickle.loads(payload)
            except Exception as exc:  # noqa: BLE001 - reported as this rank's error
                outcome = RankOutcome(rank, error=CapturedError.capture(exc))
            else:
                outcome = run_on_rank(fn, params, ctx)
            outcome.timings[CPU] = time.process_time() - cpu_begun
            data = _outcome_bytes(outcome)
            with lock:
                reporter.stop()
                conn.send_bytes(RESULT + data)
    finally:
        dist.destroy_process_group()


#: Backends that create a group's communicators at its first collective (HCCL and NCCL set up rings, links and
#: buffers then: seconds on a large node), not in ``init_process_group``.
LAZY_COMMUNICATORS = ("hccl", "nccl")


def create_communicators(backend: str, device: str, world_size: int) -> None:
    """Complete one collective on the rank's device, so that a lazy backend's communicators exist before the
    rank reports :data:`READY`: their set-up is paid at the pool's start, not inside a case's time budget."""
    if backend not in LAZY_COMMUNICATORS:
        return
    import torch
    import torch.distributed as dist

    one = torch.ones(1, device=device)
    dist.all_reduce(one)
    if one.item() != world_size:  # .item() waits for the device
        raise RuntimeError(f"{backend}: the first all-reduce of ones over {world_size} ranks gave {one.item()}")


def _completed_since(begun: int) -> Callable[[], int]:
    """How many collectives this process saw complete since the count was ``begun``."""
    from conformance.harness.completions import COMPLETED

    return lambda: COMPLETED.count - begun


def _outcome_bytes(outcome: Any) -> bytes:
    from conformance.contract.rank_errors import CapturedError
    from conformance.harness import wire

    try:
        return wire.dumps(outcome)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is the task's error
        outcome.value = None
        outcome.error = CapturedError.capture(TypeError(f"task result cannot be pickled: {exc}"))
        return wire.dumps(outcome)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    rank_main(spec.pop("rank"), spec.pop("world_size"), spec.pop("fd"), **spec)
