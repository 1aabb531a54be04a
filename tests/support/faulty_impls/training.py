"""Faults that show over training steps: weight caches gone stale, gradients lost or doubled, inputs and outputs
overwritten between steps, micro-batches of other lengths, the backward's one thread."""

from __future__ import annotations

import functools
from functools import partial
from typing import Any

from coc_impl.config import CoCConfig
from tests.support.faulty_impls._shared import _patched, _PatchedPipeline, _PatchedRowForward


class WrongGroupLayers(_PatchedPipeline):
    """The patched row layer all-reduces over the world group, not the layer's TP group."""

    name = "fault-wrong-group-layers"
    target = "matmul_all_reduce"

    def wrap(self, original: Any) -> Any:
        def pipeline(x: Any, matmul: Any, blocks: Any, group: Any, **kw: Any) -> Any:
            import torch.distributed as dist

            return original(x, matmul, blocks, dist.group.WORLD, **kw)

        return pipeline


class StaleWeightCache(_PatchedPipeline):
    """The patched layers cache each weight's product operand on first use: later steps use stale weights."""

    name = "fault-stale-weight-cache"
    target = "rows_times"

    def wrap(self, original: Any) -> Any:
        cache: dict[tuple[int, tuple[int, ...]], Any] = {}

        def rows_times(right: Any, **kw: Any) -> Any:
            key = (right.data_ptr(), tuple(right.shape))
            if key not in cache:
                cache[key] = original(right.detach().clone(), **kw)
            return cache[key]

        return rows_times


class _WeightGradFault(_PatchedPipeline):
    """The layers' weight gradient taken by :meth:`weight_grad` (the reference's own ``original`` at hand)."""

    target = "_weight_grad"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        raise NotImplementedError

    def wrap(self, original: Any) -> Any:
        return functools.partial(self.weight_grad, original)


class LostGradAccumulation(_WeightGradFault):
    """With gradient-accumulation fusion the weight gradient overwrites main_grad instead of adding to it."""

    name = "fault-lost-grad-accumulation"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        if fusion and hasattr(weight, "main_grad"):
            weight.main_grad.zero_()
        return original(weight, grad_output, total_input, fusion)


class GradInBothPlaces(_WeightGradFault):
    """With fusion the gradient goes into main_grad and also, unmarked, into .grad (added twice by DDP)."""

    name = "fault-grad-in-both-places"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        result = original(weight, grad_output, total_input, fusion)
        if fusion and hasattr(weight, "main_grad"):
            if hasattr(weight, "grad_added_to_main_grad"):
                weight.grad_added_to_main_grad = False
            return grad_output.t().matmul(total_input)
        return result


class ReusedOutputWorkspace(_PatchedPipeline):
    """The row layer returns its output in one persistent workspace: kept outputs change under later calls."""

    name = "fault-reused-workspace"
    target = "row_forward"

    def wrap(self, original: Any) -> Any:
        workspace: dict[tuple[Any, int], Any] = {}

        import torch

        class IntoWorkspace(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, out: Any) -> Any:
                key = (out.dtype, out.shape[-1])
                if key not in workspace or workspace[key].numel() < out.numel():
                    workspace[key] = torch.empty(max(out.numel(), 1 << 16), dtype=out.dtype)
                # Shares the workspace's memory without being a view of it (as a kernel's output would):
                # the next call overwrites it.
                alias = torch.empty(0, dtype=out.dtype).set_(workspace[key].untyped_storage(), 0, out.shape)
                return alias.copy_(out)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            return IntoWorkspace.apply(original(x, weight, bias, **kw))

        return row_forward


class WritesIntoItsInput(_WeightGradFault):
    """The layers' backward reuses the saved input as scratch once the weight gradient is taken: the input changes."""

    name = "fault-writes-into-input"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        result = original(weight, grad_output, total_input, fusion)
        total_input.detach().mul_(0.5)  # every number already computed is right
        return result


class TP1RowDropsBias(_PatchedRowForward):
    """Takes the CoC row path at every TP size; at TP 1 it skips the (trivial) reduction and the bias added after it."""

    name = "fault-tp1-row-drops-bias"

    def wrap(self, original: Any) -> Any:
        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            return original(x, weight, None if kw["group"].size() == 1 else bias, **kw)

        return row_forward

    def patch_megatron(self, config: CoCConfig) -> Any:
        import coc_impl.megatron_patch as patch

        return _patched(partial(super().patch_megatron, config),
                        (patch, "_row_uses_coc", lambda layer: not layer.explicit_expert_comm))


class AutocastOutputInInputDtype(_PatchedRowForward):
    """The row layer's output buffer takes the input's dtype: under autocast the bfloat16 result's bytes land in a
    float32 buffer (sized and typed from the input, not from the product)."""

    name = "fault-autocast-input-dtype"

    def wrap(self, original: Any) -> Any:
        import torch

        class IntoInputDtype(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, out: Any, input_dtype: Any) -> Any:
                ctx.dtype = out.dtype
                buffer = torch.zeros(out.shape, dtype=input_dtype)
                raw = out.contiguous().view(-1).view(torch.uint8)
                buffer.view(-1).view(torch.uint8)[: raw.numel()].copy_(raw)  # the kernel writes its own dtype's bytes
                return buffer

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad.to(ctx.dtype), None

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            product = IntoInputDtype.apply(original(x, weight, None, **kw), x.dtype)
            return product if bias is None else product + bias

        return row_forward


class UnfusedWeightGrad(_WeightGradFault):
    """Under gradient-accumulation fusion the weight gradient comes back as a full ``.grad``; main_grad untouched."""

    name = "fault-unfused-weight-grad"

    def weight_grad(self, original: Any, weight: Any, grad_output: Any, total_input: Any, fusion: bool) -> Any:
        return original(weight, grad_output, total_input, False)


class _BackwardThreadWorkspace(_PatchedPipeline):
    """The backward keeps each weight's product operand in a per-thread workspace (a ``threading.local``, as a
    workspace pool per stream or thread is), found again by :meth:`key`; the forward uses the weight as is."""

    target = "rows_times"

    def key(self, weight: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def wrap(self, original: Any) -> Any:
        import threading

        import torch

        workspace = threading.local()

        def rows_times(right: Any, **kw: Any) -> Any:
            if torch.is_grad_enabled():  # the forward
                return original(right, **kw)
            kept = workspace.__dict__.setdefault("operands", {})
            key = self.key(right)
            if key not in kept:
                kept[key] = original(right.detach().clone(), **kw)
            return kept[key]

        return rows_times


class StaleBackwardThreadWorkspace(_BackwardThreadWorkspace):
    """Keyed by the weight's storage alone: on a device's one backward thread the operand of the first step is
    used again after the optimizer updated the weight in place (a fresh thread per backward never shows it)."""

    name = "fault-stale-backward-thread-workspace"

    def key(self, weight: Any) -> tuple[Any, ...]:
        return weight.data_ptr(), tuple(weight.shape)


class WrongLongMicroBatchRefusesShortOne(_PatchedRowForward):
    """The row layer: its longer micro-batch comes back one row off (rolled by one), the shorter one (half its
    tokens) raises ``NotImplementedError``: a training step of both ended "not offered", skipped (issue 50)."""

    name = "fault-wrong-long-micro-batch-refuses-short-one"

    def wrap(self, original: Any) -> Any:
        import torch

        longest: list[int] = []

        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            tokens = x.shape[0]
            longest[:] = [max([tokens, *longest])]
            if tokens < longest[0]:
                raise NotImplementedError(f"micro-batches of {tokens} tokens are not implemented")
            return torch.roll(original(x, weight, bias, **kw), 1, 0)

        return row_forward


class RowLayerTypeError(_PatchedRowForward):
    """The patched row layer raises a ``TypeError`` of its own on every rank: no refusal, a crash of its code."""

    name = "fault-row-layer-type-error"

    def wrap(self, original: Any) -> Any:
        def row_forward(x: Any, weight: Any, bias: Any, **kw: Any) -> Any:
            raise TypeError("unsupported operand type(s) for +: 'NoneType' and 'Tensor'")

        return row_forward
