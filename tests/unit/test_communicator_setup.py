"""A rank reports ready only once its communicators exist (docs/DESIGN.md#time-budget): HCCL and NCCL create them
at a group's first collective, seconds on a large node, which must be paid at the pool's start and never inside
the first case's time budget.

No accelerator here: the rank runs the worker's own start (:func:`worker.rank_main`) in a subprocess, its backend
named hccl or nccl and carried by gloo on the CPU; the probes count every collective that completes, and the
rank's channel notes the count when READY goes out."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from conformance.harness.launchers.worker import READY, STOP
from tests.support import ROOT

RANK = '''
import json, sys
from multiprocessing.connection import Connection

import torch.distributed as dist

from conformance.harness.completions import COMPLETED
from conformance.harness.launchers import worker
from conformance.harness.probes.waits import count_completions

count_completions()
seen = {}
init = dist.init_process_group


def init_on_gloo(backend, **kwargs):
    """The named backend's group, carried by gloo (a backend's rendezvous counts as a completion: not this)."""
    init("gloo", **kwargs)
    seen["after_init"] = COMPLETED.count


send = Connection.send_bytes


def noting_ready(self, message, *args):
    if message == worker.READY:
        seen["at_ready"] = COMPLETED.count
    return send(self, message, *args)


dist.init_process_group = init_on_gloo
Connection.send_bytes = noting_ready
spec = json.loads(sys.argv[1])
worker.rank_main(0, 1, spec.pop("fd"), **spec)
print(json.dumps(seen))
'''


@pytest.mark.parametrize("backend, collectives", [("hccl", 1), ("nccl", 1), ("gloo", 0)])
def test_a_rank_is_ready_once_a_collective_completed_on_a_lazy_backend(tmp_path: Path, backend: str,
                                                                      collectives: int) -> None:
    ours, theirs = socket.socketpair()
    spec = {"fd": theirs.fileno(), "store_path": str(tmp_path / "store"), "backend": backend,
            "stack_path": str(tmp_path / "stack"), "device": "cpu", "collective_timeout_s": 60.0, "num_threads": 1}
    rank = subprocess.Popen([sys.executable, "-c", RANK, json.dumps(spec)], cwd=ROOT, pass_fds=(theirs.fileno(),),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    theirs.close()
    conn = Connection(ours.detach())
    try:
        assert conn.poll(120), "the rank never reported"
        assert conn.recv_bytes() == READY
        conn.send_bytes(STOP)
        out, err = rank.communicate(timeout=120)
    finally:
        conn.close()
        if rank.poll() is None:
            rank.kill()
    assert rank.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["at_ready"] - seen["after_init"] == collectives
