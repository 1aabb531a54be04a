"""Correct implementations that wait for their collectives in each documented way (docs/DESIGN.md#overlap-structure),
and ones that use a device as the hardware runs them (futures done at enqueue, one long-lived backward thread).

Each runs ``matmul_all_reduce`` as the reference's portable backend does --
row blocks (two, or the tiling asked for), each multiplied and then
all-reduced asynchronously while the next is multiplied -- and waits for the
blocks' collectives its own way before it returns.  Every wait here is one
``torch.distributed`` and ``torch.futures`` document, so the suite must pass
each of them ("results are values" among its checks).  Deterministic and w8A16
calls are the reference's.  Last, a layer patch keeping state on its
backward's thread that a device's long-lived backward thread must not break.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from coc_impl.deterministic import stable_product
from coc_impl.reference import ReferenceCoC
from coc_impl.validated_call import ValidatedCall
from tests.support.faulty_impls.training import _BackwardThreadWorkspace


class _WaitsItsOwnWay(ReferenceCoC):
    """The portable all-reduce pipeline, waited for by :meth:`wait`."""

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        call = ValidatedCall.validate("matmul_all_reduce", x, w, bias, **kw)  # the reference's errors
        if call.deterministic or call.antiquant is not None:
            return super().matmul_all_reduce(x, w, bias, **kw)
        product = stable_product(call.w.t() if call.transpose_weight else call.w)
        blocks = call.blocks or ((call.m // 2, call.m - call.m // 2) if call.m >= 2 else (call.m,))
        out = x.new_empty((call.m, call.n))
        works, targets, start = [], [], 0
        for rows in blocks:
            target = out[start:start + rows]
            target.copy_(product(x[start:start + rows]))
            works.append(dist.all_reduce(target, group=call.group, async_op=True))
            targets.append(target)
            start += rows
        return self.finish(call, out, works, targets)

    def finish(self, call: ValidatedCall, out: Any, works: Sequence[Any], blocks: Sequence[Any]) -> Any:
        """Wait for the blocks' collectives (:meth:`wait`), then add the bias once."""
        self.wait(works)
        return call.add_bias(out)

    def wait(self, works: Sequence[Any]) -> None:
        raise NotImplementedError


class WaitsThroughCollectAll(_WaitsItsOwnWay):
    """``torch.futures.collect_all([...]).wait()`` (issue 42: failed "results are values" at TP 8)."""

    name = "waits-through-collect-all"

    def wait(self, works: Sequence[Any]) -> None:
        import torch

        torch.futures.collect_all([w.get_future() for w in works]).wait()


class WaitsThroughThen(_WaitsItsOwnWay):
    """``work.get_future().then(cb).wait()``: the chained future completes after its source."""

    name = "waits-through-then"

    def wait(self, works: Sequence[Any]) -> None:
        for chained in [w.get_future().then(lambda f: f.value()) for w in works]:
            chained.wait()


class PollsFutureDone(_WaitsItsOwnWay):
    """Polls ``Future.done()`` until every block's future is done."""

    name = "polls-future-done"

    def wait(self, works: Sequence[Any]) -> None:
        futures = [w.get_future() for w in works]
        while not all(f.done() for f in futures):
            time.sleep(0.0005)


class PollsWorkIsCompleted(_WaitsItsOwnWay):
    """Polls ``Work.is_completed()`` until every block's collective completed."""

    name = "polls-work-is-completed"

    def wait(self, works: Sequence[Any]) -> None:
        while not all(w.is_completed() for w in works):
            time.sleep(0.0005)


class WaitsOnAHelperThread(_WaitsItsOwnWay):
    """Hands the handles to a helper thread, which waits for them, and joins it."""

    name = "waits-on-a-helper-thread"

    def wait(self, works: Sequence[Any]) -> None:
        waiter = threading.Thread(target=lambda: [w.wait() for w in works], name="coc-variant-waiter")
        waiter.start()
        waiter.join()


class ReducesInACallback(ReferenceCoC):
    """The first block's all-reduce launched, the rest multiplied meanwhile, then all-reduced and waited inside a
    ``then`` callback of the first block's future; the program waits on the future ``then`` returns (issue 50:
    "results are values" failed it, its collective "pending")."""

    name = "reduces-in-a-callback"

    def callback_runs_inline(self) -> bool:
        """Whether the first block's future is done before ``then`` (the callback then runs at once, on this
        thread: as device backends run it)."""
        return False

    def matmul_all_reduce(self, x: Any, w: Any, bias: Any = None, **kw: Any) -> Any:
        import torch.distributed as dist

        call = ValidatedCall.validate("matmul_all_reduce", x, w, bias, **kw)  # the reference's errors
        if call.deterministic or call.antiquant is not None or call.m < 2:
            return super().matmul_all_reduce(x, w, bias, **kw)
        product = stable_product(call.w.t() if call.transpose_weight else call.w)
        first = call.blocks[0] if call.blocks else call.m // 2
        out = x.new_empty((call.m, call.n))
        out[:first].copy_(product(x[:first]))
        future = dist.all_reduce(out[:first], group=call.group, async_op=True).get_future()
        out[first:].copy_(product(x[first:]))  # in flight with the first block's all-reduce
        if self.callback_runs_inline():
            while not future.done():
                time.sleep(0.0005)

        def the_rest(_: Any) -> None:
            dist.all_reduce(out[first:], group=call.group, async_op=True).wait()

        future.then(the_rest).wait()
        return call.add_bias(out)


class ReducesInAnInlineCallback(ReducesInACallback):
    """:class:`ReducesInACallback` with the callback run inline: its future is done before ``then`` is called."""

    name = "reduces-in-an-inline-callback"

    def callback_runs_inline(self) -> bool:
        return True


class BackwardThreadWorkspace(_BackwardThreadWorkspace):
    """A per-thread workspace of the backward's weight operands, keyed by the weight's storage *and version*: an
    update in place (the optimizer's step) is a new entry, so the device's one backward thread never reads a stale
    one (``tests/support/faulty_impls/training.py``: ``StaleBackwardThreadWorkspace`` keys by storage alone)."""

    name = "backward-thread-workspace"

    def key(self, weight: Any) -> tuple[Any, ...]:
        return weight.data_ptr(), tuple(weight.shape), weight._version


class AddsBiasInThen(_WaitsItsOwnWay):
    """Chains each block's bias on its collective's future (``get_future().then(...)``) and waits for the chained
    futures: on a device those futures complete at enqueue (their value valid for work queued after them), on gloo
    when the collective is done; correct either way."""

    name = "adds-bias-in-then"

    def finish(self, call: ValidatedCall, out: Any, works: Sequence[Any], blocks: Sequence[Any]) -> Any:
        chained = [w.get_future().then(lambda _, block=block: call.add_bias(block)) for w, block in zip(works, blocks)]
        for future in chained:
            future.wait()
        return out


class PerThreadBackwardWorkspace(ReferenceCoC):
    """Stages each weight gradient's rows in a workspace kept per thread across backwards (keyed by shape, dtype and
    device, every byte written before it is read, nothing returned from it): the autograd engine runs a device's
    backwards on one long-lived thread, where the workspace of the last backward is there again; correct."""

    name = "per-thread-backward-workspace"
    #: Each thread's workspaces, as long as the rank process lives.
    kept = threading.local()

    def patch_megatron(self, config: Any) -> Any:
        from contextlib import ExitStack
        from unittest import mock

        import coc_impl.scripted as scripted

        original, kept = scripted._weight_grad, self.kept

        def weight_grad(weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
            import torch

            spaces = kept.__dict__.setdefault("spaces", {})
            key = (tuple(grad_output.shape), grad_output.dtype, grad_output.device)
            if key not in spaces:
                spaces[key] = torch.empty_like(grad_output, memory_format=torch.contiguous_format)
            staged = spaces[key]
            staged.copy_(grad_output)
            return original(weight, staged, total_input, fusion)

        stack = ExitStack()
        stack.enter_context(mock.patch.object(scripted, "_weight_grad", weight_grad))
        stack.enter_context(super().patch_megatron(config))
        return stack
