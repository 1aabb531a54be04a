"""A CPU rank's backward run the way an accelerator's autograd engine runs it: on the device's own thread.

PyTorch's autograd engine runs a backward on the calling thread only for CPU
(and meta, lazy) tensors.  For CUDA, NPU (PrivateUse1) and every other device
it hands the graph to one long-lived worker thread per device
(``torch/csrc/autograd/engine.cpp``), which takes over the caller's
``at::ThreadLocalState`` -- grad mode, autocast, the local dispatch keys, the
Python dispatch- and function-mode stacks, the saved-tensor hooks -- and
nothing of Python's: no ``threading.local``, no context variables.  Code
that keeps state in Python thread-locals between its forward and its backward,
or a probe that does, breaks there and nowhere on a CPU; state a backward
leaves in a thread-local is still there at the device's next backward.

:func:`run_backward` is the one way the suite's rank code runs a backward
(``docs/DESIGN.md#on-accelerators``).  On a CPU rank with the mode on (the
default; ``--coc-same-thread-backward`` turns it off) it runs the backward on
the rank's device thread (:class:`DeviceThread`: one per rank process, or per
rank where ranks are threads of one process, started at its first backward
and reused by every later one), carrying the caller's thread-local state as
the engine does, while the caller waits, as it does for the engine; on any
other device it calls the backward where it is, and the engine moves it.  The
device thread works for the calling rank (:mod:`conformance.harness.rank_threads`):
its completions, warnings, logs, stack and CPU time are the rank's.

The emulation reads and sets that state through private torch functions
(:data:`PRIVATE_APIS`).  Where one is missing (another torch release),
:func:`unavailable` says which, and every backward runs on the calling
thread, as torch runs a CPU backward (the session says so once, in its report
header).

No CPU-backed PrivateUse1 device could be installed instead: PyTorch's OpenReg
is built from its source tree, not published on a registry, and a whole
device would move every tensor of a case off the CPU.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

from conformance.harness import rank_threads

T = TypeVar("T")
#: The name of the emulated device thread (torch_npu names its own "backward_thread").
THREAD_NAME = "coc-backward"
#: The private torch functions the emulation reads and sets the thread-local state with (``torch.`` omitted).
PRIVATE_APIS = (
    "_C._autocast_supported_devices", "_C.get_autocast_dtype", "_C.set_autocast_dtype",
    "_C._autograd._top_saved_tensors_default_hooks", "_C._autograd._push_saved_tensors_default_hooks",
    "_C._autograd._pop_saved_tensors_default_hooks",
    "_C._is_fwd_grad_enabled", "_C._set_fwd_grad_enabled", "_C._is_multithreading_enabled",
    "_C._set_multithreading_enabled", "_C._is_view_replay_enabled", "_C._set_view_replay_enabled",
    "_C._dispatch_tls_local_include_set", "_C._dispatch_tls_local_exclude_set", "_C._ForceDispatchKeyGuard",
    "_C._len_torch_dispatch_stack", "_C._get_dispatch_stack_at", "_C._len_torch_function_stack",
    "_C._get_function_stack_at", "_C._push_on_torch_function_stack", "_C._pop_torch_function_stack",
    "utils._python_dispatch._push_mode", "utils._python_dispatch._pop_mode",
)


@functools.cache
def unavailable() -> str:
    """Why this torch cannot emulate the device thread ("" when it can): the private functions it lacks."""
    import importlib

    import torch

    missing = []
    for path in PRIVATE_APIS:
        owner, _, name = path.rpartition(".")
        try:
            found = hasattr(importlib.import_module(f"torch.{owner}") if owner.startswith("utils") else
                            functools.reduce(getattr, owner.split("."), torch), name)
        except (ImportError, AttributeError):
            found = False
        if not found:
            missing.append(f"torch.{path}")
    if not missing:
        return ""
    return (f"torch {torch.__version__} lacks {', '.join(missing)}: the CPU ranks run every backward on the calling "
            "thread, as torch runs a CPU backward (the device-thread emulation is off)")


def run_backward(fn: Callable[[], T], *, device: str, off_thread: bool = True, rank: int = 0) -> T:
    """``fn()`` (a backward: ``y.backward(dy)``, ``torch.autograd.grad(...)``) as ``device``'s engine would run it.

    On a CPU ``device`` with ``off_thread``, on the device thread of rank
    ``rank`` of this process, carrying this thread's thread-local state
    (:class:`ThreadState`) and working for this thread's rank; elsewhere here
    (an accelerator's engine moves it itself; a torch without what the
    emulation needs: :func:`unavailable`).  What ``fn`` returns or raises is
    returned or raised here.
    """
    if not off_thread or device.split(":", 1)[0] != "cpu" or unavailable():
        return fn()
    thread = DeviceThread.of(f"{device}/{rank}")
    if thread is None:  # called on that device thread itself: a backward inside a backward runs where it is
        return fn()
    caller = rank_threads.rank_of()
    return thread.run(fn, ThreadState.capture(), caller, rank_threads.carry_of(caller))


class DeviceThread:
    """One device's long-lived backward thread: started at the device's first backward, reused by every later one,
    as the engine's thread is (what a backward leaves in its thread-locals is there at the next).

    Jobs run one at a time, each inside the caller's state and working for
    the caller's rank.  A thread still busy with a backward whose caller gave
    up on it (a hang the launcher tore down) is replaced for the next caller.
    """

    _lock = threading.Lock()
    _threads: dict[str, DeviceThread] = {}

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.busy = False
        self.thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
        self.thread._coc_carries_mode = True  # type: ignore[attr-defined]  # the probes' watch: not a helper
        self.thread.start()

    @classmethod
    def of(cls, key: str) -> DeviceThread | None:
        """The device thread of ``key`` (started now if it has none, or if its own is stuck busy); None when called
        on that very thread."""
        with cls._lock:
            found = cls._threads.get(key)
            if found is not None and found.thread is threading.current_thread():
                return None
            if found is None or found.busy or not found.thread.is_alive():
                found = cls._threads[key] = DeviceThread()
            found.busy = True
            return found

    def run(self, fn: Callable[[], T], state: ThreadState, rank: int | None,
            carry: Callable[[], AbstractContextManager[None]] | None) -> T:
        job = _Job(fn, state, rank, carry)
        self._jobs.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.value

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                with rank_threads.working_for(job.rank):
                    with job.carry() if job.carry is not None else nullcontext(), job.state.applied():
                        job.value = job.fn()
            except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
                job.error = exc
            finally:
                self.busy = False
                job.done.set()
            del job  # nothing of a finished backward is kept alive by its thread


@dataclass
class _Job:
    fn: Callable[[], Any]
    state: ThreadState
    rank: int | None
    carry: Callable[[], AbstractContextManager[None]] | None
    value: Any = None
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.done = threading.Event()


def _forget_threads() -> None:
    """A forked child has none of its parent's threads."""
    DeviceThread._threads = {}
    DeviceThread._lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


@dataclass(frozen=True)
class ThreadState:
    """The part of ``at::ThreadLocalState`` Python can read and set, as the engine carries it to a device thread.

    Carried: grad mode and forward-grad mode, multithreading and view replay
    of autograd, the local dispatch-key sets (autocast on or off, and any key a
    guard included or excluded), autocast's dtype per device, the Python
    dispatch-mode stack (the probes' recording among them), the Python
    function-mode stack, and the innermost saved-tensor hooks.  Not carried
    (Python cannot reach them, and a backward on a CPU does not use them):
    the debug info, record-function state, functorch's and
    functionalization's state, DTensor's implicit replication and the
    thread's stashed Python objects.
    """

    grad: bool
    forward_grad: bool
    multithreading: bool
    view_replay: bool
    included: Any
    excluded: Any
    autocast_dtypes: tuple[tuple[str, Any], ...]
    dispatch_modes: tuple[Any, ...]
    function_modes: tuple[Any, ...]
    saved_tensor_hooks: tuple[Any, Any] | None

    @classmethod
    def capture(cls) -> ThreadState:
        """This thread's state now."""
        import torch

        c = torch._C
        dtypes = []
        for device in c._autocast_supported_devices():
            try:
                dtypes.append((device, c.get_autocast_dtype(device)))
            except RuntimeError:  # a device type this build names but cannot autocast
                continue
        hooks = c._autograd._top_saved_tensors_default_hooks(True)
        return cls(
            grad=torch.is_grad_enabled(), forward_grad=c._is_fwd_grad_enabled(),
            multithreading=c._is_multithreading_enabled(), view_replay=c._is_view_replay_enabled(),
            included=c._dispatch_tls_local_include_set(), excluded=c._dispatch_tls_local_exclude_set(),
            autocast_dtypes=tuple(dtypes),
            dispatch_modes=tuple(c._get_dispatch_stack_at(i) for i in range(c._len_torch_dispatch_stack())),
            function_modes=tuple(c._get_function_stack_at(i) for i in range(c._len_torch_function_stack())),
            saved_tensor_hooks=tuple(hooks) if hooks is not None else None,  # type: ignore[arg-type]
        )

    @contextmanager
    def applied(self) -> Iterator[None]:
        """This state in force on the current thread inside the block; the thread's own state again after it."""
        import torch
        from torch.utils._python_dispatch import _pop_mode, _push_mode

        c = torch._C
        before = ThreadState.capture()
        with ExitStack() as stack:
            _set_flags(self)
            stack.callback(_set_flags, before)
            stack.enter_context(c._ForceDispatchKeyGuard(self.included, self.excluded))
            for device, dtype in self.autocast_dtypes:
                c.set_autocast_dtype(device, dtype)
            stack.callback(_set_dtypes, before)
            for mode in self.function_modes:
                c._push_on_torch_function_stack(mode)
                stack.callback(c._pop_torch_function_stack)
            for mode in self.dispatch_modes:
                _push_mode(mode)
                stack.callback(_pop_mode, getattr(mode, "_dispatch_key", None) or getattr(mode, "_mode_key", None))
            if self.saved_tensor_hooks is not None:
                c._autograd._push_saved_tensors_default_hooks(*self.saved_tensor_hooks)
                stack.callback(c._autograd._pop_saved_tensors_default_hooks)
            yield


def _set_flags(state: ThreadState) -> None:
    import torch

    c = torch._C
    torch.set_grad_enabled(state.grad)
    c._set_fwd_grad_enabled(state.forward_grad)
    c._set_multithreading_enabled(state.multithreading)
    c._set_view_replay_enabled(state.view_replay)


def _set_dtypes(state: ThreadState) -> None:
    import torch

    for device, dtype in state.autocast_dtypes:
        torch._C.set_autocast_dtype(device, dtype)
