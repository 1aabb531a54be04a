"""Every thread's Python stack, read as faulthandler dumps it, and what a rank's stack says: the lines it is at
outside collectives, and whether it waits in one now (``docs/DESIGN.md#progress-evidence``)."""

from __future__ import annotations

import faulthandler
import os
import re
import tempfile
import threading
from collections.abc import Sequence

#: Where a frame is part of a collective (torch's own code, the threaded process group's).
_COLLECTIVE_PATHS = (f"{os.sep}torch{os.sep}distributed{os.sep}",
                     f"{os.sep}torch{os.sep}testing{os.sep}_internal{os.sep}distributed{os.sep}")
#: The probes' modules: their patched ``Work.wait`` / ``is_completed`` (a wait when innermost).
_PROBES = f"{os.sep}conformance{os.sep}harness{os.sep}probes{os.sep}"

#: One frame of a thread's stack as faulthandler prints it: file, line, function.
Frame = tuple[str, str, str]
_THREAD_LINE = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME_LINE = re.compile(r'^  File "(.*)", line (\S+) in (.*)$')


def _in_collective(filename: str) -> bool:
    return any(part in filename for part in _COLLECTIVE_PATHS)


def thread_stacks() -> dict[int, tuple[Frame, ...]]:
    """Every thread's Python stack by thread ident (``threading.get_ident()``), innermost frame first.

    Read as ``faulthandler`` dumps them, not by walking ``sys._current_frames()``:
    on Python 3.11, following ``f_back`` through another thread's live frames
    from a sampling thread crashes the interpreter now and then (CPython
    gh-99110 and its sequels; profilers that sampled that way segfaulted), and
    a rank sampled 20 times a second died of it.  faulthandler reads the
    interpreter's frames in C, under the GIL, without making frame objects.
    """
    scratch = getattr(_dumps, "scratch", None)
    if scratch is None:  # one scratch file per sampling thread, kept for its life
        scratch = _dumps.scratch = _Scratch()
    dump = scratch.file
    dump.seek(0)
    dump.truncate()
    faulthandler.dump_traceback(dump, all_threads=True)
    dump.seek(0)
    stacks: dict[int, list[Frame]] = {}
    frames: list[Frame] = []
    for line in dump.read().decode(errors="replace").splitlines():
        if thread := _THREAD_LINE.match(line):
            frames = stacks.setdefault(int(thread.group(1), 16), [])
        elif frame := _FRAME_LINE.match(line):
            frames.append((frame.group(1), frame.group(2), frame.group(3)))
    return {ident: tuple(frames) for ident, frames in stacks.items()}


class _Scratch:
    """A sampling thread's scratch file, closed when the thread's locals go (not left to warn, unclosed, at exit)."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115

    def __del__(self) -> None:
        self.file.close()


_dumps = threading.local()


def format_stack(frames: Sequence[Frame]) -> str:
    """``frames`` (innermost first) as a traceback reads: outermost first."""
    return "".join(f'  File "{file}", line {line}, in {name}\n' for file, line, name in reversed(frames))


def stack_state(frames: Sequence[Frame]) -> tuple[tuple[Frame, ...], bool]:
    """A thread's stack (innermost first) as the lines it is at outside collectives, and whether it is in one now.

    In a collective: any frame is torch.distributed's (a blocking call, the
    threaded group's wait under it), or the innermost is the probes' wait.
    The frames of a collective or a wait are left out of the lines: a rank
    polling one keeps one fingerprint however often it looks.
    """
    lines, waiting = [], bool(frames) and _PROBES in frames[0][0]
    for frame in frames:
        if _in_collective(frame[0]):
            waiting = True
        elif _PROBES not in frame[0]:
            lines.append(frame)
    return tuple(lines), waiting
