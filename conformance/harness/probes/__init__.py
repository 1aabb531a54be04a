"""Observe (and perturb) the collectives and matmuls an implementation issues on this rank, on every thread.

Every call style meets in the dispatcher, so that is where collectives are
recorded (``docs/DESIGN.md#overlap-structure``); the probes by concern:

* :mod:`.collective_log`: the recording model, a rank's timeline of launches,
  waits, matmuls and marks;
* :mod:`.recording_mode`: the dispatch mode that sees every c10d op and
  functional collective however the implementation reached it --
  ``torch.distributed.all_reduce``, a name bound at its own import, a module
  alias, a wrapper -- and every matmul, naming what it multiplies
  (:mod:`conformance.harness.operands`);
* :mod:`.waits`: every documented wait patched on its class, once per
  process, so that waiting on any handle of a recorded launch is seen,
  whoever holds it and on whichever thread (a functional collective is
  waited for by ``wait_tensor``, or lazily at the first later op that reads
  its result), each wait counting as a completion
  (:mod:`conformance.harness.completions`);
* :mod:`.futures`: futures got from, chained on or gathered over recorded
  handles, and callbacks run with the mode of the recording they were
  registered in;
* :mod:`.entry_points`: the ``torch.distributed`` Python entry points,
  wrapped, for calls that never reach the dispatcher;
* :mod:`.unseen_work`: what no recording's mode reaches, noted;
* :mod:`.group_ranks`: each collective's group as global ranks.

The recording travels with PyTorch's own thread-local state, not Python's:
the code under test finds it through the dispatch-mode stack (the mode the
recording pushed), which the autograd engine carries to an accelerator's
device thread (and :mod:`conformance.harness.device_thread` to the CPU's
emulated one).  A thread that carries the mode is recorded like the thread
that recorded; per-thread scratch (the nesting of entry points) is kept per
thread under the recording.  What no mode reaches -- a helper thread, or a
callback registered outside the recording, that issues a collective or
multiplies -- is noted in the recordings of its rank, naming the thread:
their structure is then not judged, never judged on an incomplete timeline.

The same interception injects delays (:class:`~conformance.harness.stragglers.Straggler`):
before every collective, whichever entry point and thread reached it, so a
rank can be made to arrive late at each one.  Ranks running as threads
record apart: each recording is its own rank's
(:mod:`conformance.harness.rank_threads`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from conformance.harness import rank_threads
from conformance.harness.probes.collective_log import CollectiveLog
from conformance.harness.probes.entry_points import PG_METHODS, PY_COLLECTIVES, api_wrapper, coalescing
from conformance.harness.probes.futures import patch_futures
from conformance.harness.probes.group_ranks import remember_live_groups
from conformance.harness.probes.recording_mode import mode_of
from conformance.harness.probes.recordings import Recording, install_lock, live
from conformance.harness.probes.unseen_work import start_watched, unseen_if_unrecorded
from conformance.harness.probes.waits import count_completions

_installed = False


def install() -> None:
    """Patch the waits, the futures' chaining and torch.distributed's Python collectives, once per process: before
    a rank's first task (:func:`~conformance.harness.case.run_on_rank`), so that a callback the task registers
    before its first recording is one the probes can watch."""
    global _installed
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    count_completions()
    with install_lock:
        if _installed:
            return
        patch_futures(dist.distributed_c10d.Work, torch._C)
        c10d._coalescing_manager = coalescing(c10d._coalescing_manager)
        for name in PY_COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = api_wrapper(name, original)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapped)
        for method in PG_METHODS:
            original = getattr(dist.ProcessGroup, method, None)
            if original is not None:
                setattr(dist.ProcessGroup, method, unseen_if_unrecorded(f"ProcessGroup.{method}", original))
        original_start = threading.Thread.start
        threading.Thread.start = functools.wraps(original_start)(  # type: ignore[method-assign]
            lambda self: start_watched(self, original_start))
        _installed = True


@contextmanager
def record_collectives(delay: Callable[[], None] | None = None) -> Iterator[CollectiveLog]:
    """Record every collective and matmul issued inside the block, on this thread and on every thread that carries
    its dispatch mode (an accelerator's autograd device thread, the CPU's emulated one).

    ``delay`` (e.g. a :class:`~conformance.harness.stragglers.Straggler`) is called before every collective.
    """
    install()
    remember_live_groups()
    log = CollectiveLog()
    recording = Recording(log, delay, rank_threads.rank_of())
    with install_lock:
        live.append(recording)
    try:
        with mode_of(recording):
            yield log
    finally:
        with install_lock:
            live.remove(recording)

