"""The emulated device thread carries the caller's thread-local state as the autograd engine does, and no more."""

from __future__ import annotations

import threading

import pytest
import torch

from conformance.harness.device_thread import THREAD_NAME, ThreadState, run_backward


def _state_seen() -> dict[str, object]:
    c = torch._C
    return {
        "thread": threading.current_thread().name,
        "grad": torch.is_grad_enabled(),
        "autocast": torch.is_autocast_enabled("cpu"),
        "autocast dtype": torch.get_autocast_dtype("cpu"),
        "ADInplaceOrView excluded": c._dispatch_tls_is_dispatch_key_excluded(c.DispatchKey.ADInplaceOrView),
        "hooks": c._autograd._top_saved_tensors_default_hooks(True) is not None,
    }


def test_a_cpu_backward_runs_on_another_thread_with_the_callers_state() -> None:
    guard = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        with guard:
            caller = _state_seen()
            seen = run_backward(_state_seen, device="cpu")
    assert caller["ADInplaceOrView excluded"] and caller["autocast"] and caller["hooks"]
    assert seen == {**caller, "thread": THREAD_NAME}
    assert run_backward(_state_seen, device="cpu", off_thread=False)["thread"] == threading.current_thread().name


def test_an_error_on_the_device_thread_is_raised_to_the_caller() -> None:
    def fails() -> None:
        raise ValueError("backward failed")

    with pytest.raises(ValueError, match="^backward failed$"):
        run_backward(fails, device="cpu")


def test_a_thread_has_its_own_state_again_after_the_block() -> None:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        carried = ThreadState.capture()
    own = ThreadState.capture()
    with carried.applied():
        assert not torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
    assert ThreadState.capture() == own
