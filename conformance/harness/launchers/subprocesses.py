"""Ending a server process the harness started (the fork server, the rank server): asked to leave, it gets a grace
period, then is killed; either way it is reaped."""

from __future__ import annotations

import subprocess


def end_process(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """Wait up to ``grace_s`` for ``proc`` to exit (it was asked to), then kill it; reaped either way."""
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
