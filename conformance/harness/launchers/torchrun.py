"""Every rank runs the pytest session itself (``torchrun ... -m pytest``): multi-node.

The process group is initialised once from torchrun's environment.  The
session keeps the cases whose world size is the job's (creating a process
group -- Megatron's, a TP subgroup, an implementation's own -- is collective
over every rank of the job): run the job at 2, 4 and 8 ranks to cover the
suite.  A case runs in-process on this rank; outcomes are exchanged with ``all_gather_object`` so every rank's test
sees all ranks' results (and they all pass or fail together).  A hung rank
cannot be rebuilt here: on timeout every thread's stack is dumped to
:func:`stacks_path` and the session aborts, which torchrun turns into a
failed job.  Not to stderr: pytest captures it, into memory (no file
descriptor for faulthandler) or into a temporary file the abort discards.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.harness.case import RankContext, RankOutcome, RankTask, run_on_rank
from conformance.harness.impl_loader import preload_implementation
from conformance.harness.launchers import StartsNothingAhead


def stacks_path(rank: int | str) -> Path:
    """Where this rank's stacks go when a case outlives its budget (the session header names it)."""
    return Path(tempfile.gettempdir()) / f"coc-torchrun-rank{rank}.stacks"


class TorchrunLauncher(StartsNothingAhead):
    name = "torchrun"
    relaunches = False  #: the job's ranks run the whole session

    def __init__(self, backend: str | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._groups: dict[int, Any] = {}
        # Collectives on Python objects need a CPU-capable group whatever the device backend.
        self._object_group = dist.new_group(backend="gloo")
        self._stacks = open(stacks_path(self.rank), "w", encoding="utf-8")  # noqa: SIM115 (kept open)

    def _group(self, world_size: int) -> Any:
        import torch.distributed as dist

        if world_size > self.world_size:
            raise ValueError(f"a task needs {world_size} ranks; torchrun started {self.world_size}")
        if world_size not in self._groups:
            # new_group is collective: every rank creates every sub-group.
            self._groups[world_size] = dist.new_group(ranks=list(range(world_size)))
        return self._groups[world_size]

    def run(self, task: RankTask, devices: Sequence[str], impl_spec: str) -> list[RankOutcome]:
        import torch.distributed as dist

        group = self._group(task.world_size)
        outcome: RankOutcome | None = None
        if self.rank < task.world_size:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            device = "cpu" if dist.get_backend() == "gloo" else f"{_device_type()}:{local}"
            preload_implementation(impl_spec)  # before the clock: the load is not the case's
            started = time.monotonic()

            def on_budget(seconds: float) -> None:  # the task's budget, under the ceiling
                left = min(task.timeout - (time.monotonic() - started), seconds)
                faulthandler.dump_traceback_later(max(left, 0.001), exit=True, file=self._stacks)

            ctx = RankContext(self.rank, task.world_size, device, impl_spec, self.name, group,
                              on_budget=on_budget, budget=task.budget,
                              device_thread_backward=task.device_thread_backward)
            faulthandler.dump_traceback_later(task.timeout, exit=True, file=self._stacks)
            try:
                outcome = run_on_rank(task.fn, task.params, ctx)
            finally:
                faulthandler.cancel_dump_traceback_later()
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, outcome, group=self._object_group)
        return [o for o in gathered[: task.world_size]]

    def close(self) -> None:
        self._stacks.close()


def _device_type() -> str:
    return "npu" if "torch_npu" in sys.modules else "cuda"

