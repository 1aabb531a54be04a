"""The emulated device thread: the caller's thread-local state carried as the autograd engine carries it, and no
more; one long-lived thread per device (per rank where ranks are threads), as the engine keeps."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conformance.harness import device_thread
from conformance.harness.case import RankContext, RankTask
from conformance.harness.device_thread import THREAD_NAME, ThreadState, run_backward
from conformance.harness.launchers.threaded import ThreadedLauncher


def _state_seen() -> dict[str, object]:
    c = torch._C
    return {
        "thread": threading.current_thread().name,
        "grad": torch.is_grad_enabled(),
        "forward grad": c._is_fwd_grad_enabled(),
        "multithreading": c._is_multithreading_enabled(),
        "view replay": c._is_view_replay_enabled(),
        "autocast": torch.is_autocast_enabled("cpu"),
        "autocast dtype": torch.get_autocast_dtype("cpu"),
        "ADInplaceOrView excluded": c._dispatch_tls_is_dispatch_key_excluded(c.DispatchKey.ADInplaceOrView),
        "hooks": c._autograd._top_saved_tensors_default_hooks(True) is not None,
        "function modes": [type(c._get_function_stack_at(i)).__name__ for i in range(c._len_torch_function_stack())],
    }


class _SeesFunctions(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_a_cpu_backward_runs_on_another_thread_with_the_callers_state() -> None:
    """Every part of the state the emulation carries, each set away from a fresh thread's default (float16
    autocast, forward grad and multithreading off, view replay on, a function mode): a part not carried shows."""
    c = torch._C
    guard = c._ExcludeDispatchKeyGuard(c.DispatchKeySet(c.DispatchKey.ADInplaceOrView))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), _SeesFunctions():
        with guard, _flags(forward_grad=False, multithreading=False, view_replay=True):
            caller = _state_seen()
            seen = run_backward(_state_seen, device="cpu")
    fresh = _on_a_new_thread(_state_seen)
    assert all(caller[key] != fresh[key] for key in caller), (caller, fresh)  # each part shows when not carried
    assert seen == {**caller, "thread": THREAD_NAME}
    assert run_backward(_state_seen, device="cpu", off_thread=False)["thread"] == threading.current_thread().name


def test_an_error_on_the_device_thread_is_raised_to_the_caller() -> None:
    def fails() -> None:
        raise ValueError("backward failed")

    with pytest.raises(ValueError, match="^backward failed$"):
        run_backward(fails, device="cpu")


def test_a_thread_has_its_own_state_again_after_the_block() -> None:
    """float16, not the CPU's default bfloat16: a dtype left in force after the block shows."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16), _SeesFunctions(), \
            _flags(forward_grad=False, multithreading=False, view_replay=True):
        carried = ThreadState.capture()

    def applied_then_own() -> tuple[ThreadState, ThreadState, dict[str, object]]:
        own = ThreadState.capture()
        with carried.applied():
            inside = _state_seen()
        return own, ThreadState.capture(), inside

    own, after, inside = _on_a_new_thread(applied_then_own)
    assert inside["autocast dtype"] == torch.float16 and not inside["grad"] and inside["function modes"]
    assert own.autocast_dtypes == after.autocast_dtypes and dict(own.autocast_dtypes)["cpu"] == torch.bfloat16
    assert after == own


def test_a_device_keeps_one_thread_so_what_a_backward_leaves_on_it_is_there_at_the_next() -> None:
    """An implementation that caches state in a ``threading.local`` across backwards (a per-thread workspace, a
    transposed weight) meets, on a device, its own cache at the device's second backward: so does it here."""
    cache = threading.local()

    def backward() -> tuple[int, bool]:
        cached = hasattr(cache, "plan")
        cache.plan = "kept"
        return threading.get_ident(), cached

    first, second = run_backward(backward, device="cpu", rank=7), run_backward(backward, device="cpu", rank=7)
    assert first[0] == second[0] != threading.get_ident()
    assert (first[1], second[1]) == (False, True)
    assert run_backward(backward, device="cpu", rank=8)[0] != first[0]  # another device, another thread


def test_a_backward_inside_a_backward_runs_on_the_device_thread_itself() -> None:
    assert run_backward(lambda: run_backward(lambda: threading.current_thread().name, device="cpu"),
                        device="cpu") == THREAD_NAME


def test_a_device_thread_stuck_in_an_abandoned_backward_is_replaced_for_the_next_one() -> None:
    release = threading.Event()
    caller = threading.Thread(target=lambda: run_backward(release.wait, device="cpu", rank=9), daemon=True)
    caller.start()
    while "cpu/9" not in device_thread.DeviceThread._threads:
        release.wait(0.001)
    stuck = device_thread.DeviceThread._threads["cpu/9"].thread  # busy with the first caller's backward
    try:
        assert run_backward(threading.current_thread, device="cpu", rank=9) is not stuck
    finally:
        release.set()
        caller.join()


def test_without_the_private_functions_it_needs_every_backward_runs_on_the_calling_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another torch release may lack one: the emulation says which, once, and runs as the CPU does."""
    monkeypatch.delattr(torch._C, "_ForceDispatchKeyGuard")
    device_thread.unavailable.cache_clear()
    try:
        why = device_thread.unavailable()
        assert "torch._C._ForceDispatchKeyGuard" in why and "calling thread" in why
        assert run_backward(lambda: threading.current_thread().name, device="cpu") == threading.current_thread().name
    finally:
        monkeypatch.undo()
        device_thread.unavailable.cache_clear()
    assert device_thread.unavailable() == ""


def _device_threads(ctx: RankContext) -> list[int]:
    """The thread each of two backwards of this rank ran on."""
    return [ctx.backward(threading.get_ident) for _ in range(2)]


def test_every_launcher_gives_a_rank_one_device_thread_for_all_its_backwards(launcher: Any) -> None:
    """A rank process keeps one device thread across its cases; ranks that are threads of one process each have
    their own (each rank is its own device)."""
    task = RankTask(_device_threads, 2)
    first = [o.value for o in launcher.run(task, (), "coc_impl.reference:ReferenceCoC")]
    again = [o.value for o in launcher.run(task, (), "coc_impl.reference:ReferenceCoC")]
    for rank in range(2):
        assert len({*first[rank], *again[rank]}) == 1, (first, again)
    if isinstance(launcher, ThreadedLauncher):  # (thread ids of two processes may coincide)
        assert first[0][0] != first[1][0], first


def _on_a_new_thread(fn: Any) -> Any:
    box: list[Any] = []
    helper = threading.Thread(target=lambda: box.append(fn()))
    helper.start()
    helper.join()
    return box[0]


class _flags:  # noqa: N801 - used as a context manager, like torch's own guards
    """Forward grad, autograd's multithreading and view replay set inside the block, restored after it."""

    def __init__(self, *, forward_grad: bool, multithreading: bool, view_replay: bool) -> None:
        self.wanted = (forward_grad, multithreading, view_replay)

    def __enter__(self) -> None:
        c = torch._C
        self.before = (c._is_fwd_grad_enabled(), c._is_multithreading_enabled(), c._is_view_replay_enabled())
        self._set(self.wanted)

    def __exit__(self, *exc: object) -> None:
        self._set(self.before)

    @staticmethod
    def _set(values: tuple[bool, bool, bool]) -> None:
        c = torch._C
        c._set_fwd_grad_enabled(values[0])
        c._set_multithreading_enabled(values[1])
        c._set_view_replay_enabled(values[2])
