"""A rank's own evidence of progress (docs/DESIGN.md#progress-evidence): stacks, device events, reports."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from conformance.harness.progress import (
    SEND_EVERY_S,
    DeviceEvents,
    Evidence,
    Reporter,
    TaskSampler,
)
from conformance.harness.thread_stacks import format_stack, stack_state, thread_stacks


def test_a_spin_polling_in_one_line_keeps_one_stack_and_a_changing_call_tree_does_not() -> None:
    stop = threading.Event()
    stopped: list[bool] = []

    def spin() -> None:
        while not stopped:  # one line, no Python call in it
            pass

    def nested(depth: int) -> None:
        if depth:
            nested(depth - 1)
        else:
            time.sleep(0.002)

    def varied() -> None:
        step = 0
        while not stop.is_set():
            nested(step % 7)
            step += 1

    changes = {}
    for target in (spin, varied):
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        sampler = TaskSampler(thread.ident or 0, lambda: 0)
        samples, evidence = 0, sampler.sample()
        # 20 samples at least; on a loaded machine the varied thread may not run between
        # two of them, so its samples go on (up to 10 s) until its changes show
        deadline = time.monotonic() + 10
        while samples < 20 or (target is varied and evidence.stack_changes < 5 and time.monotonic() < deadline):
            evidence = sampler.sample()
            samples += 1
            time.sleep(0.013)
        stop.set()
        stopped.append(True)
        thread.join()
        stop.clear()
        changes[target.__name__] = evidence.stack_changes
    assert changes["spin"] == 0 and changes["varied"] >= 5, changes


def test_a_thread_inside_torch_distributed_is_waiting() -> None:
    release = threading.Event()
    code = compile("def wait(release):\n    release.wait()\n", "/x/torch/distributed/c10d.py", "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)  # noqa: S102 - a frame whose file is torch.distributed's
    thread = threading.Thread(target=scope["wait"], args=(release,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stacks = thread_stacks()
            if any("torch/distributed" in f[0] for f in stacks.get(thread.ident or 0, ())):
                break
            time.sleep(0.01)
        lines, waiting = stack_state(stacks[thread.ident or 0])
        assert waiting and lines and all("torch/distributed" not in file for file, _, _ in lines)
        mine = stacks[threading.get_ident()]
        assert stack_state(mine)[1] is False
        assert "test_a_thread_inside_torch_distributed_is_waiting" in format_stack(mine)
    finally:
        release.set()
        thread.join()


class ScriptedEvent:
    def __init__(self, runtime: ScriptedRuntime) -> None:
        self.runtime, self.recorded_at = runtime, -1

    def record(self, stream: Any) -> None:
        self.recorded_at = self.runtime.queued

    def query(self) -> bool:
        return self.runtime.finished >= self.recorded_at


class ScriptedRuntime:
    """A device runtime whose queue is scripted: ``queued`` items submitted, ``finished`` done."""

    def __init__(self) -> None:
        self.queued = self.finished = 0

    def is_initialized(self) -> bool:
        return True

    def Event(self) -> ScriptedEvent:  # noqa: N802 - torch.cuda's name
        return ScriptedEvent(self)

    def default_stream(self, index: int) -> None:
        return None

    @contextlib.contextmanager
    def device(self, index: int) -> Iterator[None]:
        yield


def test_device_events_count_work_completing_never_an_idle_device() -> None:
    runtime = ScriptedRuntime()
    events = DeviceEvents("cuda:0", runtime)
    assert [events.poll() for _ in range(5)] == [0] * 5, "an idle device is no progress"
    runtime.queued = 3  # a kernel queued: the next event waits behind it
    events.poll()
    assert events.poll() == 0
    runtime.finished = 3
    assert events.poll() == 1
    runtime.queued = 4  # a kernel that never finishes (a collective nobody joins)
    assert [events.poll() for _ in range(5)] == [1] * 5


def test_device_events_are_inert_on_the_cpu() -> None:
    assert DeviceEvents("cpu").poll() == 0


def test_the_latest_evidence_is_sent_even_when_it_changes_faster_than_reports() -> None:
    sent: list[Evidence] = []
    count = [0]
    reporter = Reporter(sent.append, threading.Lock())

    class Counting(TaskSampler):
        def sample(self) -> Evidence:
            return Evidence(completed=count[0])

    reporter.start(Counting(threading.get_ident(), lambda: 0))
    reporter.sample_from(0.0)
    for _ in range(5):
        count[0] += 1  # five completions within one report interval
        time.sleep(SEND_EVERY_S / 10)
    deadline = time.monotonic() + 20 * SEND_EVERY_S
    while (not sent or sent[-1].completed != 5) and time.monotonic() < deadline:
        time.sleep(0.01)
    with reporter.lock:
        reporter.stop()
    assert sent and sent[-1] == Evidence(completed=5), sent


def test_a_rank_is_sampled_only_from_where_its_budget_says() -> None:
    """A case that ends well within its budget costs no sample: none before a budget is declared, none before the
    time the budget gives (:func:`sampling_starts`), every sample from then on."""
    from conformance.harness.case_clock import MIN_WINDOW_S, SAMPLING_LEAD_S, sampling_starts

    taken: list[float] = []

    class Timed(TaskSampler):
        def sample(self) -> Evidence:
            taken.append(time.monotonic())
            return Evidence(samples=len(taken))

    reporter = Reporter(lambda e: None, threading.Lock())
    reporter.start(Timed(threading.get_ident(), lambda: 0))
    time.sleep(0.3)
    assert taken == []  # no budget yet: no verdict reads evidence before one
    began = time.monotonic()
    reporter.sample_from(0.4)
    time.sleep(0.3)
    assert taken == []
    time.sleep(0.5)
    with reporter.lock:
        reporter.stop()
    assert taken and min(taken) >= began + 0.4 and len(taken) >= 2, taken
    assert sampling_starts(10.0) == 5.0 - SAMPLING_LEAD_S  # the window the first verdict reads opens half way
    assert sampling_starts(2 * MIN_WINDOW_S - 0.1) == 0.0 == sampling_starts(0.5)  # short budgets: from the start


def test_a_rank_waiting_for_its_backward_is_sampled_on_the_thread_that_runs_it() -> None:
    """The task thread sits in ``run_backward``'s join; the emulated device thread works: its stack changes and
    its CPU time are the rank's."""
    from conformance.harness import rank_threads
    from conformance.harness.device_thread import ThreadState, run_backward

    ThreadState.capture()  # imports torch here, not on the task thread while it is sampled
    stop = threading.Event()
    evidence: list[Evidence] = []

    def nested(depth: int) -> None:
        if depth:
            nested(depth - 1)
        else:
            sum(range(20000))  # the work, at another depth each time

    def backward() -> None:
        step = 0
        while not stop.is_set():
            nested(step % 7)
            step += 1

    def task() -> None:
        with rank_threads.rank_thread():
            run_backward(backward, device="cpu")

    thread = threading.Thread(target=task, daemon=True)
    thread.start()
    sampler = TaskSampler(thread.ident or 0, lambda: 0)
    for _ in range(20):
        evidence.append(sampler.sample())
        time.sleep(0.013)
    stop.set()
    thread.join()
    assert evidence[-1].stack_changes >= 5 and evidence[-1].helper_cpu_s > 0, evidence[-1]


def test_a_sampling_threads_scratch_file_is_closed_with_the_thread() -> None:
    """Each sampling thread keeps one file to dump stacks into; it goes with the thread, closed (it once stayed open
    until the garbage collector warned of it, unclosed, at the end of long runs)."""
    import gc
    import sys

    unraisable: list[BaseException | None] = []
    before = sys.unraisablehook
    sys.unraisablehook = lambda hook: unraisable.append(hook.exc_value)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            sampler = threading.Thread(target=thread_stacks)
            sampler.start()
            sampler.join()
            del sampler
            gc.collect()
    finally:
        sys.unraisablehook = before
    assert not unraisable, unraisable
