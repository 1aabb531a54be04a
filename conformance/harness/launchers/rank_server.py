"""The session's rank server: one process per session and backend holding the warm pools every xdist worker uses.

Without it each pytest-xdist worker started its own fork server and its own
pools, so ``pytest -n 8`` imported torch and megatron-core eight times over
and started a pool of every world size in every worker; on an NPU node each
pool start is an HCCL initialisation.  The xdist controller starts this
server once (:class:`~conformance.harness.launchers.rank_server_client.RankServer`),
and every worker hands it its cases
(:class:`~conformance.harness.launchers.rank_server_client.ServerLauncher`).
The server runs each worker's cases on a thread of its own through one
:class:`~conformance.harness.launchers.process_launcher.ProcessLauncher`:
one fork server, and pools shared by all workers, several of one size where
cases of that size run at once.  Leases stay with the workers
(:mod:`conformance.harness.leases`): a worker asks the server to run a case
only on devices it holds.

A case that hangs or crashes costs only its own pool (closed by the pool and
started again on next use); the other threads' cases go on.  The server runs
no task code itself; it exits, closing every pool, when the controller
closes its standard input (and so also when the controller dies).

Other sessions may run their cases here too (``--coc-rank-server``: the
project's own tests run the suite some 170 times): a session whose code is
the server's (:func:`~conformance.harness.launchers.code_key.code_key`)
sends its environment with each request
(:class:`~conformance.harness.launchers.session_env.SessionEnv`), and its
cases run on pools of its own, forked from the same warm fork server.

Protocol (``multiprocessing.connection`` over a Unix socket, one connection
per worker, pickled tuples):

- ``("prefer", world_size[, session])``: the devices of the most recently
  used idle pool of that size (``()`` if none);
- ``("run", task_bytes, devices, impl_spec, sys_path, preload[, session])``:
  the outcomes of running the task on those devices, each as its rank
  pickled it; the task's call (its function and parameters) goes to the
  ranks as the worker pickled it, unread here, so the server imports no torch;
- ``("stats",)``: ``{"pools_started": n}``;
- ``("identity",)``: ``{"code_key": ..., "device": ..., "backend": ...}``,
  what a session compares with its own before it shares the server;
- ``("prestart",)``: start the fork server now (``None``);
- ``("preload", names)``: the modules the fork server imports beyond
  torch, complete (``None``);
- ``("warm", world_sizes[, session])``: start pools of those sizes ahead of
  their cases, first needed first; only the first worker's list counts
  (``None``);
- ``("release", session)``: close the idle pools of a session that ended
  (``None``).

``session`` is the :class:`~conformance.harness.launchers.session_env.SessionEnv`
of a session that is not the server's own (``None``: the server's session).

Every answer is ``("ok", value, start_s)`` or ``("raised", error, start_s)``,
``start_s`` being the time spent starting ranks for the request.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from conformance.harness import wire
from conformance.harness.case_errors import RankCrashed
from conformance.harness.launchers.code_key import code_key
from conformance.harness.launchers.devices import DeviceKind
from conformance.harness.launchers.process_launcher import ProcessLauncher


@dataclass(frozen=True)
class ServerSettings:
    """What the controller starts the server with (pickled into a file beside its socket)."""

    address: str
    kind: DeviceKind
    max_live_ranks: int
    num_threads: int = 1


#: What the server runs on and which code (``("identity",)``), set by :func:`main`.
identity: dict[str, str] = {}


def handle(request: tuple[Any, ...], launcher: ProcessLauncher) -> tuple[str, Any, float]:
    """The answer to one request (see the module docstring)."""
    op = request[0]
    try:
        if op == "prefer":
            return ("ok", launcher.preferred_devices(*request[1:]), 0.0)
        if op == "stats":
            return ("ok", {"pools_started": launcher.pools_started()}, 0.0)
        if op == "identity":
            return ("ok", identity, 0.0)
        if op == "release":
            launcher.release(request[1])
            return ("ok", None, 0.0)
        if op == "prestart":
            launcher.prestart()
            return ("ok", None, 0.0)
        if op == "preload":
            launcher.want_preloaded(request[1], now=True)
            return ("ok", None, 0.0)
        if op == "warm":
            launcher.warm(*request[1:])
            return ("ok", None, 0.0)
        if op != "run":
            raise ValueError(f"unknown rank server request {op!r}")
        _, task_bytes, devices, impl_spec, sys_path, preload, *session = request
        for entry in sys_path:  # where the task's function is importable from
            if entry and entry not in sys.path:
                sys.path.append(entry)
        launcher.want_preloaded(preload)
        # The outcomes go back as the ranks pickled them: the worker reads them, the server never needs to.
        outcomes = launcher.run(wire.loads(task_bytes), devices, impl_spec, sys_path, *session, raw=True)
    except BaseException as exc:  # noqa: BLE001 - the worker's case fails with it
        return ("raised", _picklable(exc), launcher.last_start_s if op == "run" else 0.0)
    return ("ok", outcomes, launcher.last_start_s)


def _picklable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - said as text instead
        return RankCrashed("the rank server failed running the case:\n"
                           + "".join(traceback.format_exception(exc)))
    return exc


def _serve_worker(conn: Connection, launcher: ProcessLauncher) -> None:
    """Answer one worker's requests, one at a time, until it disconnects."""
    with conn:
        while True:
            try:
                request = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return
            try:
                conn.send_bytes(wire.dumps(handle(request, launcher)))
            except (OSError, ValueError):
                return  # the worker died waiting; the pool went back warm


def main() -> None:
    settings: ServerSettings = pickle.loads(Path(sys.argv[1]).read_bytes())
    identity.update(code_key=code_key(), device=settings.kind.name, backend=settings.kind.backend)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops it, also on Ctrl-C
    launcher = ProcessLauncher(settings.kind, max_live_ranks=settings.max_live_ranks,
                               num_threads=settings.num_threads)
    listener = Listener(settings.address, family="AF_UNIX")

    def stop_when_controller_leaves() -> None:
        sys.stdin.buffer.read()  # returns at EOF: closed by the controller, or the controller died
        launcher.close()
        listener.close()
        os._exit(0)

    threading.Thread(target=stop_when_controller_leaves, name="controller-watch", daemon=True).start()
    print("ready", flush=True)
    while True:
        try:
            conn = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve_worker, args=(conn, launcher), name="worker", daemon=True).start()


if __name__ == "__main__":
    main()
