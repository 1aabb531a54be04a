"""A CPU rank's backward run the way an accelerator's autograd engine runs it: on another thread.

PyTorch's autograd engine runs a backward on the calling thread only for CPU
(and meta, lazy) tensors.  For CUDA, NPU (PrivateUse1) and every other device
it hands the graph to a per-device worker thread
(``torch/csrc/autograd/engine.cpp``), which takes over the caller's
``at::ThreadLocalState`` -- grad mode, autocast, the local dispatch keys, the
Python dispatch- and function-mode stacks, the saved-tensor hooks -- and
nothing of Python's: no ``threading.local``, no context variables.  Code
that keeps state in Python thread-locals between its forward and its backward,
or a probe that does, breaks there and nowhere on a CPU.

:func:`run_backward` is the one way the suite's rank code runs a backward
(``docs/DESIGN.md#on-accelerators``).  On a CPU rank with the mode on (the
default; ``--coc-same-thread-backward`` turns it off) it runs the backward on
a fresh thread carrying the caller's thread-local state as the engine does,
while the caller waits, as it does for the engine; on any other device it
calls the backward where it is, and the engine moves it.  The helper works for
the calling rank (:mod:`conformance.harness.rank_threads`): its completions,
warnings, logs, stack and CPU time are the rank's.

No CPU-backed PrivateUse1 device could be installed instead: PyTorch's OpenReg
is built from its source tree, not published on a registry, and a whole
device would move every tensor of a case off the CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

from conformance.harness import rank_threads

T = TypeVar("T")
#: The name of the emulated device thread (torch_npu names its own "backward_thread").
THREAD_NAME = "coc-backward"


def run_backward(fn: Callable[[], T], *, device: str, off_thread: bool = True) -> T:
    """``fn()`` (a backward: ``y.backward(dy)``, ``torch.autograd.grad(...)``) as ``device``'s engine would run it.

    On a CPU ``device`` with ``off_thread``, on a helper thread that carries
    this thread's thread-local state (:class:`ThreadState`) and works for this
    thread's rank; elsewhere here (an accelerator's engine moves it itself).
    What ``fn`` returns or raises is returned or raised here.
    """
    if not off_thread or device.split(":", 1)[0] != "cpu":
        return fn()
    state = ThreadState.capture()
    rank = rank_threads.rank_of()
    carry = rank_threads.carry_of(rank)
    box: dict[str, Any] = {}

    def device_thread() -> None:
        with rank_threads.working_for(rank):
            try:
                with carry() if carry is not None else nullcontext(), state.applied():
                    box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
                box["error"] = exc

    worker = threading.Thread(target=device_thread, name=THREAD_NAME, daemon=True)
    worker._coc_carries_mode = True  # type: ignore[attr-defined]  # the probes' watch of helper threads: not one
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


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
