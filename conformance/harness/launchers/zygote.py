"""A fork server for rank processes: torch (and megatron) imported once, ranks forked from it.

Starting a rank as a fresh interpreter costs its imports: about 2.5 s of CPU
for torch and 6 s more for megatron-core on the machines this suite targets,
times eight for a TP 8 pool, and again whenever a hang or a crash forces a
pool to be rebuilt.  The zygote pays them once per launcher: it imports
:data:`PRELOAD` and then, on request, forks a child that becomes a rank
(:func:`conformance.harness.launchers.worker.rank_main`).

Forking is safe because the zygote never starts a thread, a device runtime
(:data:`NO_DRIVER_CHECK`; torch_npu, loaded at ``import torch`` by its
``torch.backends`` entry point, only imports) or a process group: it only
imports, and refuses to fork when an import started a device runtime
(:func:`runtimes_started`, ``docs/DESIGN.md#fork-safety``).  megatron-core
is preloaded only when the session runs layer cases (:data:`MEGATRON`).  A
child applies its environment (device visibility, set before any device
runtime starts), redirects its output to its log file and runs the rank loop.  The zygote reaps its children and writes
each exit status next to the rank's log (``<log>.exit``), so the pool can say
how a rank died.  It exits when the launcher's control socket closes, killing
the ranks it forked.

Protocol on the control socket (a Unix socket pair): the zygote imports
:data:`PRELOAD` as soon as it starts (the launcher starts it early, while
pytest collects), then reads one line naming the further modules to import,
comma-separated, and answers ``ready``.  Then the launcher sends one
JSON request ``{"spec": {...}, "env": {...}, "log": path, "session": ...,
"preload": [...]}`` together with two file descriptors (the rank's end of its
socket pair, and nothing else); the zygote imports the modules of
``preload`` it has not imported yet (named since, by a session that needs
them: a rank server shared by sessions), forks, and answers with the child's
pid as text.  ``session``, when not null, is the environment
(``{"variables": {...}, "cwd": path}``) the child takes on whole before
``env`` (:class:`~conformance.harness.launchers.session_env.SessionEnv`).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from coc_shared.reaping import reap_exited

#: Imported before the first fork; each is optional (a missing one is imported by the rank as needed).
PRELOAD = (
    "torch",
    "torch.distributed",
    # torch.use_deterministic_algorithms (the poisoned allocations of every case) imports inductor,
    # and with it dynamo, on its first call: seconds of CPU a fresh rank would spend inside a case's budget.
    "torch._inductor.config",
    "numpy",
    "conformance.harness.launchers.worker",
    # every rank loads the implementation through it (and it imports pytest, for the option names): 70 ms a rank
    "conformance.harness.impl_loader",
    "conformance.harness.case",
    "conformance.harness.probes",
    "conformance.cases.op_cases",
    "conformance.cases.layer_cases",
    "golden",
)
#: Preloaded too when the session runs layer cases (megatron-core takes seconds to import).
MEGATRON = ("coc_shared.megatron",)
#: ``torch.cuda.is_available()`` starts the CUDA driver unless this is set, and a child forked after that cannot
#: use CUDA ("Cannot re-initialize CUDA in forked subprocess"); megatron-core calls it on import. With it set,
#: the check asks NVML and the zygote stays free of a device runtime.
NO_DRIVER_CHECK = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
_MAX_REQUEST = 1 << 20


def serve(control: socket.socket) -> None:
    """Answer fork requests until the control socket closes."""
    children: dict[int, str] = {}

    def exited(pid: int, code: int) -> None:
        log = children.pop(pid, None)
        if log is not None:
            try:
                with open(log + ".exit", "w") as f:
                    f.write(str(code))
            except OSError:
                pass

    def reap(*_: Any) -> None:
        reap_exited(exited)

    signal.signal(signal.SIGCHLD, reap)
    try:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(control, _MAX_REQUEST, 1)
            except InterruptedError:
                continue
            if not message:
                break
            request = json.loads(message)
            if request.get("preload"):
                preload(request["preload"])
                _refuse_if_runtimes_started(request["preload"])
            # Reaping waits until the child is recorded, however fast it dies.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            try:
                pid = os.fork()
                if pid == 0:
                    control.close()
                    _become_rank(request, fds[0])
                os.close(fds[0])
                children[pid] = request["log"]
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            control.sendall(f"{pid}\n".encode())
    finally:
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _become_rank(request: dict[str, Any], fd: int) -> None:
    """In the forked child: environment, output, then the rank loop; never returns."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.setpgid(0, 0)  # signals aimed at the launcher's group leave ranks alone
        session = request.get("session")
        if session is not None:  # another session's ranks: its environment, as its own fork server would give it
            os.chdir(session["cwd"])
            os.environ.clear()
            os.environ.update({**NO_DRIVER_CHECK, **session["variables"]})
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from conformance.harness.launchers.worker import rank_main

        rank_main(**{**request["spec"], "fd": fd})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a dying rank says why in its log
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def preload(extra: Sequence[str] = ()) -> None:
    """Import :data:`PRELOAD` and ``extra`` with CUDA's driver check kept off the driver."""
    os.environ.update(NO_DRIVER_CHECK)
    # Imports leave almost no cyclic garbage, and each full collection among torch's objects costs a tenth of a
    # second of the start every pool waits for: no collection while importing.  What was imported is frozen, so
    # that no collection in a rank walks (and so copies, page by page) every object torch and megatron left here.
    gc.disable()
    try:
        for name in (*PRELOAD, *extra):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - optional: the rank imports what it needs
                pass
    finally:
        gc.freeze()
        gc.enable()


def runtimes_started() -> list[str]:
    """The device runtimes this process has started (``docs/DESIGN.md#fork-safety``): a child forked after
    that cannot use its device ("Cannot re-initialize CUDA/NPU in forked subprocess").

    An NPU backend is loaded at ``import torch`` wherever it registers a
    ``torch.backends`` entry point (torch_npu 2.5 and later), so it is in the
    fork server whether or not anything preloads it: importing it must not
    have initialised its runtime.  Asked of torch_npu whenever it is in
    ``sys.modules``, and of the device module of whichever package registered
    torch's PrivateUse1 device (``torch.npu``), however it was loaded.
    """
    started = []
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        started.append("CUDA (torch.cuda is initialised)")
    torch_npu = sys.modules.get("torch_npu")
    npu = getattr(torch_npu, "npu", None)
    if npu is not None and npu.is_initialized():
        started.append("the NPU runtime (torch_npu initialised ACL)")
    name = torch._C._get_privateuse1_backend_name() if torch is not None else "privateuseone"
    device = getattr(torch, name, None) if name != "privateuseone" else None
    initialized = getattr(device, "is_initialized", None)
    if device is not npu and callable(initialized) and initialized():
        started.append(f"the {name} runtime (torch.{name} is initialised, {getattr(device, '__name__', name)})")
    return started


def _refuse_if_runtimes_started(imported: Sequence[str]) -> None:
    """Exit, saying why, once importing ``imported`` started a device runtime: every rank forked now would fail on
    its device (the launcher reads the reason from this process's log; the ranks forked so far are killed)."""
    started = runtimes_started()
    if started:
        print(f"refusing to fork ranks: importing {', '.join((*PRELOAD, *imported))} started "
              f"{' and '.join(started)}", flush=True)
        sys.exit(3)


def _read_line(control: socket.socket) -> str:
    """One line from the control socket, read byte by byte (the fork requests that follow carry descriptors)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = control.recv(1)
        if not byte:
            sys.exit(0)  # the launcher went away before it needed a rank
        line += byte
    return line.decode().strip()


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    preload()
    # The launcher names the rest once it knows them (megatron-core when layer cases were collected),
    # while this process has imported torch in the meantime.
    extra = [name for name in _read_line(control).split(",") if name]
    preload(extra)
    _refuse_if_runtimes_started(extra)
    control.sendall(b"ready\n")
    serve(control)
    # Nothing here needs tearing down, and unloading torch and megatron-core would keep the session waiting.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
