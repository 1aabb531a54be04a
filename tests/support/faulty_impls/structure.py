"""Faults of the layers' overlap structure: serial paths where overlap is declared, declared overlap that is not
there, and work the probes cannot follow (a helper thread, a callback registered before the recording)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from coc_impl.config import CoCConfig
from coc_impl.reference import ReferenceCoC
from conformance.protocol import PHASE_COLLECTIVES
from tests.support.faulty_impls._shared import (
    _PatchedPipeline,
    _waited_at_once,
    _whole_blocking_gather,
    _with_user_cfgs,
)


class PatchNotApplied(ReferenceCoC):
    """Accepts every configuration but never patches megatron: silently serial."""

    name = "fault-not-patched"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import nullcontext

        return nullcontext()


class FusedRowSilentlySerial(ReferenceCoC):
    """Under --coc-fused-kernel the row layer falls back to megatron's one synchronous all-reduce."""

    name = "fault-fused-row-serial"

    def patch_megatron(self, config: CoCConfig) -> Any:
        from contextlib import ExitStack

        from coc_shared.megatron import RowParallelLinear

        stack = ExitStack()
        stack.enter_context(super().patch_megatron(config))
        if config.fused_kernel:
            patched = RowParallelLinear.__dict__["forward"]
            stack.callback(setattr, RowParallelLinear, "forward", patched)
            RowParallelLinear.forward = patched.__wrapped__  # megatron's own forward
        return stack


class AsyncFlagButBlocking(_PatchedPipeline):
    """Passes async_op=True positionally, then waits at once: the chunks never overlap anything."""

    name = "fault-async-but-blocking"
    target = "matmul_all_reduce"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            import torch.distributed as dist

            from coc_impl import reducers

            class Blocking(reducers.CollectiveReducer):
                def all_reduce(self, partial: Any, out: Any, group: Any) -> Any:
                    return _waited_at_once(lambda t: dist.all_reduce(t, dist.ReduceOp.SUM, group, True), partial, out)

            return original(x, matmul, blocks, group, reducer=Blocking(), **kw)

        return pipeline


class MlpSpBackwardGatherSerial(_PatchedPipeline):
    """The row layer's SP backward gathers dy in one synchronous all-gather (caught inside the MLP too)."""

    name = "fault-mlp-sp-backward-serial"
    target = "all_gather_matmul"

    def elsewhere(self, original: Any, *args: Any, **kw: Any) -> Any:
        """The all-gather + matmul called from anywhere but the row backward."""
        return original(*args, **kw)

    def wrap(self, original: Any) -> Any:
        import sys

        import coc_impl.scripted as scripted

        row_backward = inspect.unwrap(scripted._RowParallelMatmul.backward).__code__

        def all_gather_matmul(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            if sys._getframe(1).f_code is not row_backward:
                return self.elsewhere(original, x, matmul, blocks, group, **kw)
            return _whole_blocking_gather(x, matmul, group)

        return all_gather_matmul


class DeclaresNoOverlap(ReferenceCoC):
    """Declares every layer phase not overlapped (``none``): its overlap structure has nothing to be judged on."""

    name = "fault-declares-no-overlap"
    overlap = {key: "none" for key in PHASE_COLLECTIVES}


class DeclaresOverlapsOutput(ReferenceCoC):
    """Correct: declares that the SP column forward's all-gather overlaps the output matmul (it does, chunked)."""

    name = "variant-declares-overlaps-output"
    overlap = {**ReferenceCoC.overlap, "column/sp/forward": "overlaps:output"}


class SerialGatherDeclaredOverlapsOutput(_PatchedPipeline):
    """Declares the SP forward all-gather overlaps the output matmul, but gathers x whole, blocking, first."""

    name = "fault-serial-gather-declared-overlaps-output"
    overlap = DeclaresOverlapsOutput.overlap
    target = "all_gather_matmul"

    def wrap(self, original: Any) -> Any:
        def all_gather_matmul(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            return _whole_blocking_gather(x, matmul, group)

        return all_gather_matmul


def _helper_thread_matmul() -> None:
    """A 2x2 matmul on a helper thread, started and joined: work no recording mode reaches."""
    import threading

    import torch

    helper = threading.Thread(target=lambda: torch.ones(2, 2) @ torch.ones(2, 2), name="coc-helper")
    helper.start()
    helper.join()


class SerialBackwardBesideAHelperMatmul(MlpSpBackwardGatherSerial):
    """``MlpSpBackwardGatherSerial`` (the row SP backward, declared chunked, gathers serially), and a 2x2 matmul on
    a helper thread in the column forward: that phase is not judged, the serial backward still fails (issue 50: the
    first phase not judged ended the structure check, "not judged")."""

    name = "fault-serial-backward-beside-a-helper-matmul"

    def elsewhere(self, original: Any, *args: Any, **kw: Any) -> Any:
        _helper_thread_matmul()
        return original(*args, **kw)


class RegathersOnAHelperThread(_PatchedPipeline):
    """Ignores ``recompute_all_gather=False``, and gathers the input again for the weight gradient on a helper
    thread, where no probe records it: the check cannot see the re-gather, so it must not pass (issue 50)."""

    name = "fault-regathers-on-a-helper-thread"
    target = "all_gather"

    def patch_megatron(self, config: CoCConfig) -> Any:
        return super().patch_megatron(_with_user_cfgs(config, recompute_all_gather=True))

    def wrap(self, original: Any) -> Any:
        import threading

        class Gathered:
            def __init__(self, value: Any) -> None:
                self.value = value

            def wait(self) -> Any:
                return self.value

        def all_gather(x: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            box: dict[str, Any] = {}
            helper = threading.Thread(target=lambda: box.update(out=original(x, blocks, group, **kw).wait()),
                                      name="coc-regather")
            helper.start()
            helper.join()
            return Gathered(box["out"])

        return all_gather


class CallbackFromBeforeTheRecording(_PatchedPipeline):
    """Registers at ``configure`` (before any recording) a callback that multiplies, on a future a thread started
    then completes during the next layer forward: that matmul is not in the phase's timeline, so its structure must
    not be judged (issue 50: whether to watch a callback was decided when it was registered)."""

    name = "fault-callback-from-before-the-recording"
    target = "matmul_all_reduce"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import threading

        import torch

        later: Any = torch.futures.Future()
        later.then(lambda _: torch.ones(2, 2) @ torch.ones(2, 2))
        go = threading.Event()
        self.go, self.completer = go, threading.Thread(target=lambda: (go.wait(), later.set_result(None)),
                                                       name="coc-completer", daemon=True)
        self.completer.start()
        return super().configure(argv, env, **kw)

    def wrap(self, original: Any) -> Any:
        def pipeline(*args: Any, **kw: Any) -> Any:
            completer = getattr(self, "completer", None)
            if completer is not None and completer.is_alive():
                self.go.set()
                completer.join()
            return original(*args, **kw)

        return pipeline
