"""Per-case overhead of the warm rank pool vs. spawning fresh ranks per case.

The spawn column is how DeepSpeed's and torch's ``MultiProcessTestCase`` run a
distributed test: start W processes, initialise the process group, run one
small all-reduce, tear down.  The pool columns are this harness with W
already-initialised ranks: ``pool_ms`` is its own per-case cost (an empty
case: pickling, pipes, result collection), ``pool_allreduce_ms`` the same
small all-reduce case as the spawn column.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta

from conformance.harness.case import RankContext, RankTask
from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.options import DEFAULT_IMPL


def empty_case(ctx: RankContext) -> int:
    return ctx.rank


def tiny_case(ctx: RankContext) -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(8)
    dist.all_reduce(t, group=ctx.group)
    return float(t[0])


def _spawned_rank(rank: int, world_size: int, store_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    t = torch.ones(8)
    dist.all_reduce(t)
    dist.destroy_process_group()


def spawn_per_case_ms(world_size: int) -> float:
    """One case the MultiProcessTestCase way: spawn, init, run, join."""
    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        tmp.start_processes(_spawned_rank, args=(world_size, os.path.join(d, "store")),
                            nprocs=world_size, start_method="spawn", join=True)
        return (time.perf_counter() - start) * 1e3


IMPL = DEFAULT_IMPL


def pool_per_case_ms(launcher: ProcessLauncher, task: RankTask, cases: int) -> float:
    """Median wall time of one case on a warm pool."""
    times = []
    for _ in range(cases):
        t0 = time.perf_counter()
        launcher.run(task, (), IMPL)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench overhead")
    parser.add_argument("--world-sizes", default="2,4,8")
    parser.add_argument("--cases", type=int, default=200, help="pool cases per world size")
    parser.add_argument("--spawns", type=int, default=2, help="spawned cases per world size")
    args = parser.parse_args(argv)
    sizes = [int(w) for w in args.world_sizes.split(",")]
    figures: dict[str, dict[str, float]] = {}
    print(f"{'world':>5} {'pool ms':>9} {'pool+allreduce ms':>18} {'pool start ms':>14} "
          f"{'spawn ms':>9} {'spawn/pool':>11}")
    for world_size in sizes:
        launcher = ProcessLauncher(cpu(max(sizes)), max_live_ranks=world_size)
        try:
            start = time.perf_counter()
            launcher.run(RankTask(empty_case, world_size), (), IMPL)
            startup = (time.perf_counter() - start) * 1e3
            pool_ms = pool_per_case_ms(launcher, RankTask(empty_case, world_size), args.cases)
            allreduce_ms = pool_per_case_ms(launcher, RankTask(tiny_case, world_size), args.cases)
        finally:
            launcher.close()
        spawn_ms = statistics.median(spawn_per_case_ms(world_size) for _ in range(args.spawns))
        figures[str(world_size)] = {
            "pool_ms": round(pool_ms, 3), "spawn_ms": round(spawn_ms, 1),
            "pool_allreduce_ms": round(allreduce_ms, 3), "pool_start_ms": round(startup, 1),
        }
        print(f"{world_size:>5} {pool_ms:>9.3f} {allreduce_ms:>18.3f} {startup:>14.1f} "
              f"{spawn_ms:>9.1f} {spawn_ms / pool_ms:>10.0f}x")
    print(json.dumps(figures))
    return 0
