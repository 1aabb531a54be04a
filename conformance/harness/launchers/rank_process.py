"""One rank process of a pool, forked by the fork server or started as an interpreter: alive, its exit code,
signalled, reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class RankProcess:
    """A rank process: forked by the zygote (``pid``) or started as an interpreter (``popen``)."""

    def __init__(self, pid: int, log: Path, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid, self.log, self.popen = pid, log, popen

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if self.log.with_name(self.log.name + ".exit").exists():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def exit_code(self, wait_s: float = 2.0) -> int | None:
        """The exit code, waiting up to ``wait_s`` for it to be known."""
        if self.popen is not None:
            try:
                return self.popen.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                return None
        status = self.log.with_name(self.log.name + ".exit")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                return int(status.read_text())
            except (OSError, ValueError):
                time.sleep(0.02)
        return None

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def reap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
