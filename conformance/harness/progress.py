"""Whether a case's ranks are still progressing, judged per rank on evidence no other rank can lend.

Elapsed time alone makes a slow case on a busy machine look hung
(``docs/DESIGN.md#time-budget``, ``#progress-evidence``).  Each rank's own
evidence counts, never the sum over ranks:

* the CPU time of its *task thread*
  (:class:`~conformance.harness.cpu_time.ProgressWatch`);
* collectives it saw complete (:data:`conformance.harness.completions.COMPLETED`);
* its task thread's Python stack changing between samples, outside
  ``torch.distributed`` (:class:`TaskSampler`; a spin in one line, or a
  poll of a collective, does not change it);
* work it queued on its device completing (:class:`DeviceEvents`, CUDA and
  NPU; inert on the CPU);

and whether it is *waiting* in a collective right now (a frame of its task
thread is in ``torch.distributed``, or it is in the probes' wait:
:func:`conformance.harness.thread_stacks.stack_state`): a waiting rank is
not stalled, it waits for others.  A pool rank's :class:`Reporter` sends
this evidence to the pool; the threaded launcher samples its rank threads
itself.  :mod:`conformance.harness.case_clock` judges it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from conformance.harness import rank_threads
from conformance.harness.cpu_time import cpu_seconds
from conformance.harness.thread_stacks import Frame, stack_state, thread_stacks

#: Samples at which a rank's stack must have changed over a window for that to be progress ...
MIN_STACK_CHANGES = 2
#: ... and the share of the window's samples they must be.
STACK_CHANGE_SHARE = 0.1
#: Samples a rank's evidence must hold over a window before the rank can be called stalled.
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Evidence:
    """What one rank showed of its progress since its task began: counters that only grow, and its state now."""

    completed: int = 0  #: collectives it saw complete
    stack_changes: int = 0  #: samples at which its task thread's stack differed from the one before
    device_done: int = 0  #: device events, queued behind its work, that completed
    samples: int = 0  #: samples taken of its stack
    waiting: bool = False  #: its task thread (or a thread working for it) is inside a collective now
    #: CPU seconds its helper threads used (the emulated device thread running its backward): judged with its task
    #: thread's CPU time, against the same share of a core
    helper_cpu_s: float = 0.0

    def grew(self, since: Evidence) -> list[str]:
        """The counters that grew since ``since`` (empty: no progress of this rank's own).

        The stack must have changed at :data:`MIN_STACK_CHANGES` samples and
        at :data:`STACK_CHANGE_SHARE` of them: a loop that sleeps and checks
        is seen, now and then, on its other line; work is seen somewhere new
        at most samples.
        """
        grew = [name for name in ("completed", "device_done") if getattr(self, name) > getattr(since, name)]
        changes = self.stack_changes - since.stack_changes
        if changes >= max(MIN_STACK_CHANGES, STACK_CHANGE_SHARE * (self.samples - since.samples)):
            grew.append("stack_changes")
        return grew

    def seen(self, since: Evidence) -> bool:
        """Whether the rank was sampled often enough since ``since`` to be called stalled (a starved sampler is not)."""
        return self.samples - since.samples >= MIN_SAMPLES

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class DeviceEvents:
    """Events recorded in turn on a device's default stream; one that was queued behind work and completes is progress.

    An event found complete at the first look after its record was queued
    behind nothing (an idle device) and does not count.  Real on ``cuda:N`` and
    ``npu:N`` once the rank's task has started that runtime (it is never
    started here: the fork server keeps it unstarted); inert on the CPU.
    """

    def __init__(self, device: str, runtime: Any = None) -> None:
        kind, _, index = device.partition(":")
        self.kind, self.index = kind, int(index or 0)
        self.done = 0
        self._given = runtime  #: a runtime to use instead of ``torch.<kind>`` (tests script one)
        self._event: Any = None
        self._seen_pending = False

    def _runtime(self) -> Any:
        if self.kind not in ("cuda", "npu"):
            return None
        if self._given is not None:
            return self._given
        torch = sys.modules.get("torch")
        runtime = getattr(torch, self.kind, None) if torch is not None else None
        try:
            return runtime if runtime is not None and runtime.is_initialized() else None
        except Exception:  # noqa: BLE001 - a runtime that cannot say is one we do not read
            return None

    def poll(self) -> int:
        """Events that completed behind work so far (records the next one when the last has completed)."""
        runtime = self._runtime()
        if runtime is None:
            return self.done
        with runtime.device(self.index):
            if self._event is not None:
                if not self._event.query():
                    self._seen_pending = True
                    return self.done
                self.done += self._seen_pending
            self._event, self._seen_pending = runtime.Event(), False
            self._event.record(runtime.default_stream(self.index))
        return self.done


class TaskSampler:
    """Samples one rank thread's evidence (:class:`Evidence`) in its own process, from another thread.

    ``completed`` says how many collectives the rank saw complete.  The
    threads working for the rank thread
    (:func:`conformance.harness.rank_threads.helpers_of`: the CPU's emulated
    device thread, while it runs a backward and the task thread waits for it)
    are sampled with it: their stacks are part of its stack, their waits its
    waits, their CPU time its ``helper_cpu_s``.  With ``whole_process`` (a
    rank that is a process), the rank also waits while any other Python thread
    of it is in a collective (a task waiting for a helper thread that waits
    for the others).
    """

    def __init__(self, thread_id: int, completed: Callable[[], int], device: str = "cpu", *,
                 whole_process: bool = False) -> None:
        self.thread_id, self._completed, self._whole_process = thread_id, completed, whole_process
        self._device = DeviceEvents(device)
        self._stack: tuple[Frame, ...] | None = None
        self._changes = self._samples = 0
        self._helper_cpu: dict[int, float] = {}  #: native id -> its CPU seconds when last read (ended ones kept)

    def sample(self) -> Evidence:
        stacks = thread_stacks()
        stack, waiting = stack_state(stacks.get(self.thread_id, ()))
        for ident, native in rank_threads.helpers_of(self.thread_id):
            frames, helper_waits = stack_state(stacks.get(ident, ()))
            stack, waiting = stack + (("(helper thread)", str(ident), ""), *frames), waiting or helper_waits
            used = cpu_seconds(os.getpid(), [native])
            if used is not None:
                self._helper_cpu[native] = used
        if self._whole_process and not waiting:
            me = threading.get_ident()
            waiting = any(stack_state(f)[1] for t, f in stacks.items() if t not in (me, self.thread_id))
        if self._stack is not None and stack != self._stack:
            self._changes += 1
        self._stack = stack
        try:
            device = self._device.poll()
        except Exception:  # noqa: BLE001 - a device error is the task's to report, not the sampler's
            device = self._device.done
        self._samples += 1
        return Evidence(self._completed(), self._changes, device, self._samples, waiting,
                        round(sum(self._helper_cpu.values()), 6))


class Reporter:
    """A daemon thread that samples a rank's task thread every :data:`SAMPLE_EVERY_S` once a verdict may read its
    evidence, while a task runs.

    Sampling starts when the task's budget says (:meth:`sample_from`: a verdict
    reads evidence only from about half the budget on,
    :func:`conformance.harness.case_clock.sampling_starts`), so a case that
    ends well within its budget costs no sample.  It sends the rank's
    :class:`Evidence` when it differs from the last sent, at most every
    :data:`SEND_EVERY_S`; a change not yet sent is sent at a later sample, so
    the latest evidence always reaches the pool (none is dropped), at most
    :data:`SEND_EVERY_S` late.
    """

    def __init__(self, send: Callable[[Evidence], None], lock: threading.Lock) -> None:
        self._send, self.lock = send, lock
        self._sampler: TaskSampler | None = None
        self._from = float("inf")  #: when sampling starts (monotonic)
        self._last: Evidence | None = None
        self._sent_at = 0.0
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="coc-progress", daemon=True).start()

    def start(self, sampler: TaskSampler) -> None:
        """Sample ``sampler``'s thread once its budget says (a task began)."""
        with self.lock:
            self._sampler, self._last, self._from = sampler, None, float("inf")

    def sample_from(self, delay_s: float) -> None:
        """Sample from ``delay_s`` seconds on (or from when an earlier call said, if sooner)."""
        self._from = min(self._from, time.monotonic() + delay_s)
        self._wake.set()

    def stop(self) -> None:
        """Stop sampling; call with :attr:`lock` held, so no report follows what the caller sends next."""
        self._sampler, self._from = None, float("inf")

    def _run(self) -> None:
        while True:
            wait = self._from - time.monotonic()
            if wait > SAMPLE_EVERY_S:  # nothing to sample yet: sleep until then, or until a budget says otherwise
                self._wake.wait(None if wait == float("inf") else wait)
                self._wake.clear()
                continue
            time.sleep(SAMPLE_EVERY_S)
            with self.lock:
                if self._sampler is None or time.monotonic() < self._from:
                    continue
                evidence = self._sampler.sample()
                now = time.monotonic()
                if evidence != self._last and now - self._sent_at >= SEND_EVERY_S:
                    self._last, self._sent_at = evidence, now
                    self._send(evidence)


#: How often a rank's evidence is sampled: several times in the shortest budget (a test's 0.5 s).
SAMPLE_EVERY_S = 0.05
#: The shortest interval between two reports of a rank (a budget is seconds long).
SEND_EVERY_S = 0.2
