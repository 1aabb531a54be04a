"""Running test code on the emulated node: in fresh processes, never in the pytest process.

Activating the emulator changes the process for good (the ``npu`` device, ``torch_npu`` in
``sys.modules``), and the pytest process is shared with other tests; so every test body that needs the
device runs in a child.  Children come from one fork server per pytest process (started once, with torch
imported, emulator not active), so a child costs a fork, not an interpreter start; the server never
starts the NPU runtime, so its children may (the fork rule).  A child sets the environment it is given,
activates the emulator, and, for :func:`run_ranks`, joins an ``hccl`` group over a file rendezvous.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_CONTEXT: list[Any] = []


def _context():
    if not _CONTEXT:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["torch", "torch.distributed", "npu_sim.activation"])
        _CONTEXT.append(context)
    return _CONTEXT[0]


class ChildFailed(AssertionError):
    """Test code in a child process raised; the message carries its traceback."""


#: Variables a child starts without unless a test sets them: the tests are hermetic to the runner's environment.
_CLEARED = {name: None for name in ("ASCEND_RT_VISIBLE_DEVICES", "HCCL_DETERMINISTIC", "NPU_SIM", "NPU_SIM_CARDS",
                                     "NPU_SIM_SOC", "NPU_SIM_NODE_DIR", "NPU_SIM_HCCL_SETUP_DELAY")}


def _child(queue, rank: int, world: int, call: bytes, env: dict, init_file: str | None) -> None:
    try:
        for key, value in {**_CLEARED, **env}.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import npu_sim

        npu_sim.activate()
        # Unpickled once the device exists: importing the function's module may run a backward, and autograd's
        # engine gives a device its thread only if the device was there at the process's first backward.
        fn, args = pickle.loads(call)
        if init_file is not None:
            import torch
            import torch.distributed as dist

            torch.npu.set_device(0)
            dist.init_process_group("hccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
            try:
                result = fn(rank, world, *args)
            finally:
                dist.destroy_process_group()
        else:
            result = fn(*args)
        queue.put((rank, True, result))
    except BaseException as error:  # noqa: BLE001 - everything goes back to the test
        queue.put((rank, False, f"rank {rank}: {type(error).__name__}: {error}\n{traceback.format_exc()}"))


def _run(fn: Callable, args: tuple, envs: list[dict], init_file: str | None, timeout: float) -> list[Any]:
    """One child per entry of ``envs`` (child i is rank i); their results, or :class:`ChildFailed`."""
    context = _context()
    queue = context.Queue()
    world = len(envs)
    call = pickle.dumps((fn, args))
    processes = [context.Process(target=_child, args=(queue, rank, world, call, env, init_file), daemon=True)
                 for rank, env in enumerate(envs)]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    failures: list[str] = []
    try:
        for _ in processes:
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = value
            else:
                failures.append(value)
    except Exception as error:
        raise ChildFailed(f"{world - len(results) - len(failures)} child(ren) gave no result within {timeout} s "
                          f"({error!r}); failures: {failures}") from None
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    if failures:
        raise ChildFailed("\n".join(failures))
    return [results[rank] for rank in range(world)]


def in_npu_process(fn: Callable, *args: Any, env: dict | None = None, timeout: float = 60) -> Any:
    """``fn(*args)`` in a fresh process with the emulator active; its result, or :class:`ChildFailed`."""
    return _run(fn, args, [env or {}], None, timeout)[0]


def run_ranks(fn: Callable, world: int, tmp_path: Path, *args: Any, env: dict | None = None,
              timeout: float = 60) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` ranks of an ``hccl`` group (one process each); results by rank.

    Rank r sees one card, ``ASCEND_RT_VISIBLE_DEVICES=r`` (unless ``env`` says otherwise); the node's card
    locks live under ``tmp_path``.
    """
    init_file = str(tmp_path / f"rendezvous-{os.urandom(4).hex()}")
    envs = [{"NPU_SIM_NODE_DIR": str(tmp_path / "node"), "ASCEND_RT_VISIBLE_DEVICES": str(rank), **(env or {})}
            for rank in range(world)]
    return _run(fn, args, envs, init_file, timeout)
