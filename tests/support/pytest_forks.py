"""pytest sessions in fresh processes whose imports are paid once: a fork server for the project's suite runs.

A run of the suite in a subprocess (``run_suite``) pays the interpreter's
start and the imports of pytest, numpy and torch (about 2 s of CPU on the
2-core machine) before it collects a case, and the project's tests make some
170 of them.  :class:`PytestForks` starts one process per test process that
imports :data:`PRELOAD` and then forks a child per run.  The child takes on
the run's working directory, environment, import path and arguments, runs
pytest as ``python -m pytest`` does, and exits; the server records its exit
status.

What the child imports and rewrites is what a fresh process would: the
modules imported ahead are never ones pytest rewrites (plugins, conftests,
test modules) nor the project's own.  Settings read when the interpreter or
torch starts (``PYTHON*`` but ``PYTHONPATH``, the OpenMP and torch
variables) come from the server's environment, so a run whose values differ
is left to a fresh process (:meth:`PytestForks.forks`).  The server itself
is run as a script, so that no module of the project is imported ahead.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Imported before the first fork: none of them is rewritten by pytest, all of them by every run.
PRELOAD = ("torch", "torch.distributed", "numpy", "pytest")
#: Variables read when the interpreter, OpenMP or torch starts: a run must share the server's values to be forked.
STARTUP_PREFIXES = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_", "LD_")
#: ... and these, read whole: ``NPU_SIM`` switches the emulated NPU node on at ``import torch`` (its other settings
#: are read later, by the process that needs them).
STARTUP_VARIABLES = ("NPU_SIM",)


def startup_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` read at start-up (:data:`STARTUP_PREFIXES`, :data:`STARTUP_VARIABLES`;
    ``PYTHONPATH`` is the run's own)."""
    return {k: v for k, v in environ.items()
            if (k.startswith(STARTUP_PREFIXES) or k in STARTUP_VARIABLES) and k != "PYTHONPATH"}


class PytestForks:
    """The test process's handle on the fork server: started here, stopped by :meth:`close`."""

    def __init__(self, start_timeout_s: float = 120.0) -> None:
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its path: the interpreter's own
        self.settings = startup_settings(env)
        self._proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], env=env, cwd="/",
                                      stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()
        self._sock = ours
        self._sock.settimeout(start_timeout_s)
        self._reader = self._sock.makefile("rb")
        if self._reader.readline().strip() != b"ready":
            self.close()
            raise RuntimeError(f"the pytest fork server did not start (exit code {self._proc.poll()})")
        self._sock.settimeout(60)

    def forks(self, env: Mapping[str, str]) -> bool:
        """Whether a run in ``env`` can be forked here (its start-up settings are the server's)."""
        return self._proc.poll() is None and startup_settings(env) == self.settings

    def runpytest(self, pytester: Any, *args: str, timeout: float | None = None) -> Any:
        """What ``pytester.runpytest_subprocess(*args, timeout=timeout)`` returns, the session forked here when
        :meth:`forks` allows (the same arguments, working directory, environment, files and timeout)."""
        import pytest
        from _pytest.pathlib import make_numbered_dir

        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
        if not self.forks(env):
            return pytester.runpytest_subprocess(*args, timeout=timeout)
        basetemp = make_numbered_dir(root=pytester.path, prefix="runpytest-", mode=0o700)
        argv = [f"--basetemp={basetemp}", *map(str, args)]
        print("running (forked):", sys.executable, "-mpytest", *argv)
        print("     in:", Path.cwd())
        stdout, stderr = pytester.path / "stdout", pytester.path / "stderr"
        status = pytester.path / "status"
        status.unlink(missing_ok=True)
        begun = time.monotonic()
        request = {"argv": argv, "env": env, "cwd": os.getcwd(), "stdout": str(stdout), "stderr": str(stderr),
                   "status": str(status)}
        self._sock.sendall(json.dumps(request).encode() + b"\n")
        pid = int(self._reader.readline())
        while not status.exists():
            if timeout is not None and time.monotonic() - begun > timeout:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                raise pytester.TimeoutExpired(f"{timeout} second timeout expired running: {argv}")
            time.sleep(0.02)
        ret: Any = int(status.read_text())
        out = stdout.read_text(encoding="utf8").splitlines()
        err = stderr.read_text(encoding="utf8").splitlines()
        pytester._dump_lines(out, sys.stdout)
        pytester._dump_lines(err, sys.stderr)
        with contextlib.suppress(ValueError):
            ret = pytest.ExitCode(ret)
        return pytest.RunResult(ret, out, err, time.monotonic() - begun)

    def close(self) -> None:
        from conformance.harness.launchers.subprocesses import end_process  # not at the top: the server is a script

        self._reader.close()
        self._sock.close()
        end_process(self._proc, grace_s=30)


def _run(request: dict[str, Any], base_path: Sequence[str]) -> None:
    """In the forked child: become ``python -m pytest <argv>`` in the request's directory and environment, run,
    exit as the interpreter would; never returns."""
    code: Any = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.setpgid(0, 0)  # a run that times out is killed with the processes it started
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = [os.getcwd(), *filter(None, request["env"].get("PYTHONPATH", "").split(os.pathsep)),
                       *base_path]
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf8", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf8", errors="backslashreplace",  # noqa: SIM115
                                           closefd=False)
        sys.argv = ["-m", *request["argv"]]  # argv[0] becomes pytest's __main__, as with ``python -m pytest``
        runpy.run_module("pytest", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - said on the run's stderr, as the interpreter would
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    # The project's reaping loop, read from its file: this script imports no module of the project.
    reap_exited = runpy.run_path(str(Path(__file__).resolve().parents[2] / "coc_shared" / "reaping.py"))["reap_exited"]
    for name in PRELOAD:
        importlib.import_module(name)
    base_path = list(sys.path[1:])  # the interpreter's own (sys.path[0]: this script's folder)
    statuses: dict[int, str] = {}

    def exited(pid: int, code: int) -> None:
        path = statuses.pop(pid, None)
        if path is not None:
            with contextlib.suppress(OSError):
                Path(path + ".tmp").write_text(str(code))
                os.replace(path + ".tmp", path)

    def reap(*_: Any) -> None:
        reap_exited(exited)

    signal.signal(signal.SIGCHLD, reap)
    control.sendall(b"ready\n")
    reader = control.makefile("rb")
    while True:
        line = reader.readline()
        if not line:
            break
        request = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reaped only once recorded
        try:
            pid = os.fork()
            if pid == 0:
                reader.close()
                control.close()
                _run(request, base_path)
            statuses[pid] = request["status"]
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        control.sendall(f"{pid}\n".encode())
    for pid in list(statuses):  # the test process ended: its runs go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os._exit(0)


if __name__ == "__main__":
    main()
