"""A second, independent CoC implementation "in Megatron style", for judging the conformance suite.

It shares no code with ``coc_impl`` (the reference): only torch and megatron.core (and, for its types, the
protocol).
It is written the way Megatron-LM writes its own tensor-parallel code, which is
what the suite must judge fairly:

* flags come from its own ``argparse`` parser (a bad value exits with
  argparse's ``SystemExit(2)``); the legacy environment variables
  (``COC_PARALLEL_NUM`` / ``USE_COC_FUSED_KERNEL``) are ignored and
  ``--coc-parallel-num auto`` is refused by argparse;
* incompatible or invalid settings are refused with plain ``assert`` (an
  ``AssertionError`` naming the flag), only when CoC is enabled; no error
  classes are declared;
* it never warns (not about overridden settings, not about falling back to one
  chunk);
* collectives are called with ``async_op`` *positionally*, through the legacy
  names: ``all_reduce(t, ReduceOp.SUM, group, True)``,
  ``_all_gather_base(out, x, group, True)``,
  ``_reduce_scatter_base(out, x, ReduceOp.SUM, group, True)``;
* no fused ops and no fused-kernel layers.

Overlap, per layer phase (declared in :attr:`MegatronStyleCoC.overlap`):

==================  ===========================================================
row, no SP, fwd     ``x @ W.T`` cut into p row chunks; chunk i's async all-reduce
                    is in flight while chunk i+1 is multiplied
row, SP, fwd        the same with a reduce-scatter per chunk (chunk i covers rows
                    ``i*b:(i+1)*b`` of every rank's sequence shard)
column, SP, fwd     communicate-first: the all-gather of chunk i+1 is launched
                    before chunk i is multiplied; rows come out rank-major, as
                    after one serial all-gather
row, SP, bwd        the same for ``dy`` (all-gather), then ``dx = dy @ W``
column, no SP, bwd  one async all-reduce of ``dx`` in flight while ``dW`` is computed
column, SP, bwd     one async reduce-scatter of ``dx`` in flight while ``dW`` is
                    computed; ``x`` is gathered again for ``dW`` unless
                    ``coc_cfgs['recompute_all_gather']`` is False
==================  ===========================================================
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

if TYPE_CHECKING:  # typing has Unpack from 3.11
    from typing import Unpack

    from conformance.protocol import ModelSettings

# Same autocast behaviour as megatron's own linear autograd function.
_custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")

VALID_CHUNKS = (1, 2, 4, 8)
USER_CFG_DEFAULTS: dict[str, Any] = {
    "matmul_soc_friendly": True,
    "customized_coc": {},
    "enable_coc_in_column_backward": False,
    "recompute_all_gather": True,
}
_SHAPE_KEY = re.compile(r"^\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-style-coc", add_help=False)
    group = parser.add_argument_group(title="CoC")
    group.add_argument("--use-ascend-coc", action="store_true",
                       help="Overlap the TP linear layers' matmuls with their collectives.")
    group.add_argument("--coc-parallel-num", type=int, default=1, choices=VALID_CHUNKS,
                       help="Chunks the overlapped matmuls are cut into (1: no CoC).")
    group.add_argument("--coc-fused-kernel", action="store_true",
                       help="Fused kernels (not available in this implementation).")
    return parser


PARSER = _build_parser()


@dataclass(frozen=True)
class MegatronStyleConfig:
    """The effective configuration."""

    enabled: bool = False
    parallel_num: int = 1
    fused_kernel: bool = False
    user_cfgs: dict[str, Any] = field(default_factory=lambda: dict(USER_CFG_DEFAULTS))


def _validate_user_cfgs(coc_cfgs: Mapping[str, Any] | None) -> dict[str, Any]:
    cfgs = dict(USER_CFG_DEFAULTS, customized_coc={})
    if coc_cfgs is None:
        return cfgs
    assert isinstance(coc_cfgs, Mapping), f"coc_cfgs must be a dict, got {type(coc_cfgs).__name__}"
    for key, value in coc_cfgs.items():
        assert key in USER_CFG_DEFAULTS, f"coc_cfgs: unknown key {key!r} (known: {sorted(USER_CFG_DEFAULTS)})"
        if key == "customized_coc":
            assert isinstance(value, Mapping), "coc_cfgs['customized_coc'] must map '[m, k, n]' to a chunk count"
            parsed: dict[tuple[int, int, int], int] = {}
            for shape, chunks in value.items():
                match = _SHAPE_KEY.match(shape) if isinstance(shape, str) else None
                assert match is not None, f"coc_cfgs['customized_coc']: key {shape!r} is not '[m, k, n]'"
                assert not isinstance(chunks, bool) and chunks in VALID_CHUNKS, \
                    f"coc_cfgs['customized_coc'][{shape!r}] = {chunks!r}: the chunk count must be one of {VALID_CHUNKS}"
                parsed[(int(match[1]), int(match[2]), int(match[3]))] = int(chunks)
            cfgs[key] = parsed
        else:
            assert isinstance(value, bool), f"coc_cfgs[{key!r}] must be True or False, got {value!r}"
            cfgs[key] = value
    return cfgs


# ---------------------------------------------------------------------------------------------------------------
# Collectives, Megatron style (positional async_op, legacy names), always looked up on torch.distributed at call
# time.


def _all_reduce(tensor: torch.Tensor, group: Any) -> Any:
    return torch.distributed.all_reduce(tensor, torch.distributed.ReduceOp.SUM, group, True)


def _all_gather(out: torch.Tensor, tensor: torch.Tensor, group: Any) -> Any:
    return torch.distributed._all_gather_base(out, tensor, group, True)


def _reduce_scatter(out: torch.Tensor, tensor: torch.Tensor, group: Any) -> Any:
    return torch.distributed._reduce_scatter_base(out, tensor, torch.distributed.ReduceOp.SUM, group, True)


# ---------------------------------------------------------------------------------------------------------------
# Pipelines on 2-D rows.


def _matmul_all_reduce(x: torch.Tensor, right: torch.Tensor, chunks: int, group: Any) -> torch.Tensor:
    """``all_reduce(x @ right)``: chunk i's all-reduce in flight while chunk i+1 is multiplied."""
    m = x.shape[0]
    step = m // chunks
    out = x.new_empty((m, right.shape[1]))
    handles = []
    for i in range(chunks):
        rows = out[i * step:(i + 1) * step]
        torch.matmul(x[i * step:(i + 1) * step], right, out=rows)
        handles.append(_all_reduce(rows, group))
    for handle in handles:
        handle.wait()
    return out


def _matmul_reduce_scatter(x: torch.Tensor, right: torch.Tensor, chunks: int, group: Any) -> torch.Tensor:
    """``reduce_scatter(x @ right)`` along rows; chunk i covers rows ``i*b:(i+1)*b`` of every rank's shard."""
    tp = group.size()
    shard = x.shape[0] // tp
    step = shard // chunks
    by_rank = x.reshape(tp, shard, x.shape[1])
    out: torch.Tensor | None = None
    pending = []
    for i in range(chunks):
        part = by_rank[:, i * step:(i + 1) * step].reshape(tp * step, x.shape[1])
        partial = torch.matmul(part, right)
        if out is None:  # the product's dtype, not the input's (they differ under autocast)
            out = partial.new_empty((shard, right.shape[1]))
        pending.append((_reduce_scatter(out[i * step:(i + 1) * step], partial, group), partial))
    for handle, _partial in pending:
        handle.wait()
    assert out is not None
    return out


def _all_gather_matmul(x: torch.Tensor, right: torch.Tensor, chunks: int, group: Any,
                       keep_gathered: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``all_gather(x) @ right``, communicate-first; also the gathered ``x`` with ``keep_gathered``.

    Chunk i is rows ``i*b:(i+1)*b`` of every rank's shard; its product lands in
    those rows of every rank's block of the output, so the result is laid out
    rank-major exactly like one serial all-gather along dim 0.
    """
    tp = group.size()
    shard, k = x.shape
    n = right.shape[1]
    step = shard // chunks

    def launch(i: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
        part = x[i * step:(i + 1) * step].contiguous()
        buf = x.new_empty((tp * step, k))
        return buf, _all_gather(buf, part, group), part

    if chunks == 1:
        buf, handle, _part = launch(0)
        handle.wait()
        return torch.matmul(buf, right), (buf if keep_gathered else None)
    out = x.new_empty((tp * shard, n))
    gathered = x.new_empty((tp * shard, k)) if keep_gathered else None
    out_by_rank = out.view(tp, shard, n)
    nxt = launch(0)
    for i in range(chunks):
        buf, handle, _part = nxt
        if i + 1 < chunks:
            nxt = launch(i + 1)  # in flight while chunk i is multiplied
        handle.wait()
        out_by_rank[:, i * step:(i + 1) * step] = torch.matmul(buf, right).view(tp, step, n)
        if gathered is not None:
            gathered.view(tp, shard, k)[:, i * step:(i + 1) * step] = buf.view(tp, step, k)
    return out, gathered


def _keep_for_backward(ctx: Any, weight: torch.Tensor, call: _Call) -> None:
    """Keep the call and the weight's ``main_grad`` (what the fusion accumulates into) for the backward."""
    ctx.call = call
    ctx.main_grad = weight.main_grad if call.fusion and hasattr(weight, "main_grad") else None


def _backward_start(ctx: Any,
                    grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, _Call, bool, bool, torch.Tensor]:
    """What a backward starts from: the saved input and weight (its ``main_grad`` put back), the call, whether dx
    and dw are needed, and ``grad_output`` made contiguous."""
    saved, weight = ctx.saved_tensors
    call: _Call = ctx.call
    if call.fusion and ctx.main_grad is not None:
        weight.main_grad = ctx.main_grad
    return saved, weight, call, ctx.needs_input_grad[0], ctx.needs_input_grad[1], grad_output.contiguous()


def _weight_grad(weight: torch.Tensor, main_grad: torch.Tensor | None, grad_output: torch.Tensor,
                 total_input: torch.Tensor, fusion: bool) -> torch.Tensor | None:
    """``dy.T @ x``, or Megatron's gradient-accumulation fusion into ``main_grad`` (fp32 accumulation)."""
    if not (fusion and main_grad is not None):
        return grad_output.t().matmul(total_input)
    main_grad.addmm_(grad_output.t().to(main_grad.dtype), total_input.to(main_grad.dtype))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    make = torch.zeros if getattr(weight, "zero_out_wgrad", False) else torch.empty
    grad = make(main_grad.shape, dtype=total_input.dtype, device=total_input.device, requires_grad=False)
    weight.grad_added_to_main_grad = True
    return grad


@dataclass(frozen=True)
class _Call:
    """The non-tensor arguments of one layer call."""

    group: Any
    sequence_parallel: bool
    fusion: bool
    forward_chunks: int = 1
    backward_chunks: int = 1
    keep_gathered: bool = False


class _ColumnLinear(torch.autograd.Function):
    """``x @ W.T`` of a column-parallel layer on 2-D rows (W: this rank's ``[out/tp, in]``)."""

    @staticmethod
    @_custom_fwd
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, call: _Call) -> torch.Tensor:
        _keep_for_backward(ctx, weight, call)
        if not call.sequence_parallel:
            ctx.save_for_backward(x, weight)
            return torch.matmul(x, weight.t())
        out, gathered = _all_gather_matmul(x, weight.t(), call.forward_chunks, call.group, call.keep_gathered)
        ctx.save_for_backward(gathered if call.keep_gathered else x, weight)
        return out

    @staticmethod
    @_custom_bwd
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        saved, weight, call, needs_dx, needs_dw, grad_output = _backward_start(ctx, grad_output)
        tp = call.group.size()
        gather = None
        total_input = saved
        if needs_dw and call.sequence_parallel and not call.keep_gathered:
            total_input = saved.new_empty((tp * saved.shape[0], saved.shape[1]))
            gather = _all_gather(total_input, saved, call.group)  # overlaps the dx matmul
        grad_input = grad_output.matmul(weight) if needs_dx else None
        if gather is not None:
            gather.wait()
        handle = None
        if grad_input is not None:
            if call.sequence_parallel:
                sub = grad_input.new_empty((grad_input.shape[0] // tp, grad_input.shape[1]))
                handle = _reduce_scatter(sub, grad_input, call.group)
                grad_input = sub
            else:
                handle = _all_reduce(grad_input, call.group)
        # The weight gradient runs while dx's collective is in flight.
        grad_weight = _weight_grad(weight, ctx.main_grad, grad_output, total_input, call.fusion) if needs_dw else None
        if handle is not None:
            handle.wait()
        return grad_input, grad_weight, None


class _RowLinear(torch.autograd.Function):
    """``x @ W.T`` of a row-parallel layer on 2-D rows (W: this rank's ``[out, in/tp]``), reduced."""

    @staticmethod
    @_custom_fwd
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, call: _Call) -> torch.Tensor:
        _keep_for_backward(ctx, weight, call)
        ctx.save_for_backward(x, weight)
        if call.sequence_parallel:
            return _matmul_reduce_scatter(x, weight.t(), call.forward_chunks, call.group)
        return _matmul_all_reduce(x, weight.t(), call.forward_chunks, call.group)

    @staticmethod
    @_custom_bwd
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        x, weight, call, needs_dx, needs_dw, grad_output = _backward_start(ctx, grad_output)
        if call.sequence_parallel:
            grad_input, total_grad_output = _all_gather_matmul(grad_output, weight, call.backward_chunks,
                                                               call.group, keep_gathered=needs_dw)
        else:
            total_grad_output = grad_output
            grad_input = grad_output.matmul(weight) if needs_dx else None
        grad_weight = None
        if needs_dw:
            grad_weight = _weight_grad(weight, ctx.main_grad, total_grad_output, x, call.fusion)
        return (grad_input if needs_dx else None), grad_weight, None


# ---------------------------------------------------------------------------------------------------------------
# Chunk counts: bound when patch_megatron is entered, decided from shapes alone (every rank alike, before any
# collective).


class _Chunker:
    def __init__(self, parallel_num: int, customized: Mapping[tuple[int, int, int], int]) -> None:
        self.parallel_num = parallel_num
        self.customized = dict(customized)

    def __call__(self, what: str, m: int, k: int, n: int, rows: int) -> int:
        """Chunks for the matmul ``[m, k] @ [k, n]`` whose collective splits ``rows`` rows on this rank."""
        chunks = self.customized.get((m, k, n), self.parallel_num)
        if chunks == 1 or rows < chunks:
            return 1  # fewer rows than chunks: unchunked
        assert rows % chunks == 0, (
            f"megatron-style CoC: {what}: m={m} tokens ({rows} rows to split on this rank) cannot be cut into "
            f"--coc-parallel-num {chunks} equal chunks")
        return chunks


def _column_uses_coc(layer: ColumnParallelLinear) -> bool:
    return ((layer.allreduce_dgrad or layer.sequence_parallel) and layer.tp_group.size() > 1
            and not layer.explicit_expert_comm and not layer.config.defer_embedding_wgrad_compute
            and layer.config._cpu_offloading_context is None)


def _row_uses_coc(layer: RowParallelLinear) -> bool:
    return (layer.tp_group.size() > 1 and not layer.explicit_expert_comm
            and layer.config._cpu_offloading_context is None)


def _make_column_forward(original: Any, chunker: _Chunker, keep_gathered: bool) -> Any:
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    @functools.wraps(original)
    def forward(self: ColumnParallelLinear, input_: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not _column_uses_coc(self):
            return original(self, input_, weight, runtime_gather_output)
        if weight is None:
            if self.weight is None:
                raise RuntimeError("weight was not supplied to ColumnParallelLinear forward pass "
                                   "and skip_weight_param_allocation is True.")
            weight = self.weight
        else:
            expected_shape = (self.output_size_per_partition, self.input_size)
            if weight.shape != expected_shape:
                raise RuntimeError(f"supplied weight's shape is {tuple(weight.shape)}, "
                                   f"not {expected_shape} as expected")
        tp = self.tp_group.size()
        x = input_.reshape(-1, input_.shape[-1]).contiguous()
        forward_chunks = 1
        if self.sequence_parallel:
            forward_chunks = chunker("ColumnParallelLinear forward (all-gather)", x.shape[0] * tp,
                                     weight.shape[1], weight.shape[0], x.shape[0])
        call = _Call(self.tp_group, self.sequence_parallel, self.gradient_accumulation_fusion,
                     forward_chunks=forward_chunks, keep_gathered=self.sequence_parallel and keep_gathered)
        rows = _ColumnLinear.apply(x, weight, call)
        lead = (input_.shape[0] * tp, *input_.shape[1:-1]) if self.sequence_parallel else input_.shape[:-1]
        output_parallel = rows.view(*lead, rows.shape[-1])
        if not self.skip_bias_add and self.bias is not None:
            output_parallel = output_parallel + self.bias
        gather_output = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather_output:
            output = gather_from_tensor_model_parallel_region(output_parallel, group=self.tp_group)
        else:
            output = output_parallel
        return output, (self.bias if self.skip_bias_add else None)

    return forward


def _make_row_forward(original: Any, chunker: _Chunker) -> Any:
    from megatron.core.tensor_parallel.mappings import scatter_to_tensor_model_parallel_region

    @functools.wraps(original)
    def forward(self: RowParallelLinear, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not _row_uses_coc(self):
            return original(self, input_)
        if self.input_is_parallel:
            input_parallel = input_
        else:
            assert not self.sequence_parallel
            input_parallel = scatter_to_tensor_model_parallel_region(input_, group=self.tp_group)
        tp = self.tp_group.size()
        weight = self.weight
        x = input_parallel.reshape(-1, input_parallel.shape[-1]).contiguous()
        m = x.shape[0]
        k, n = weight.shape[1], weight.shape[0]
        backward_chunks = 1
        if self.sequence_parallel:
            assert input_parallel.shape[0] % tp == 0, (
                f"megatron-style CoC: RowParallelLinear with sequence parallelism: a sequence of "
                f"{input_parallel.shape[0]} (m={m} tokens) cannot be reduce-scattered over "
                f"--tensor-model-parallel-size {tp}")
            shard = m // tp
            forward_chunks = chunker("RowParallelLinear forward (reduce-scatter)", m, k, n, shard)
            backward_chunks = chunker("RowParallelLinear backward (all-gather dy)", m, n, k, shard)
        else:
            forward_chunks = chunker("RowParallelLinear forward (all-reduce)", m, k, n, m)
        call = _Call(self.tp_group, self.sequence_parallel, self.gradient_accumulation_fusion,
                     forward_chunks=forward_chunks, backward_chunks=backward_chunks)
        rows = _RowLinear.apply(x, weight, call)
        lead = ((input_parallel.shape[0] // tp, *input_parallel.shape[1:-1]) if self.sequence_parallel
                else input_parallel.shape[:-1])
        output_ = rows.view(*lead, rows.shape[-1])
        if not self.skip_bias_add:
            output = (output_ + self.bias) if self.bias is not None else output_
            output_bias = None
        else:
            output = output_
            output_bias = self.bias
        return output, output_bias

    return forward


class MegatronStyleCoC:
    """A CoC implementation as Megatron-LM would write it (module docstring)."""

    name = "megatron-style"
    protocol_version = 2
    fused_layers = False
    overlap = {
        "row/nosp/forward": "chunked",
        "row/sp/forward": "chunked",
        "column/sp/forward": "chunked",
        "row/sp/backward": "chunked",
        "column/nosp/backward": "overlaps:weight_grad",
        "column/sp/backward": "overlaps:weight_grad",
    }

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, *,
                  coc_cfgs: Mapping[str, Any] | None = None, **model: Unpack[ModelSettings]) -> MegatronStyleConfig:
        del env  # the legacy COC_PARALLEL_NUM / USE_COC_FUSED_KERNEL variables are not read
        args = PARSER.parse_args(list(argv) if argv is not None else [])
        if not args.use_ascend_coc:
            return MegatronStyleConfig(enabled=False, parallel_num=args.coc_parallel_num)
        tp_size, num_experts = model["tp_size"], model.get("num_experts")
        assert not isinstance(tp_size, bool) and isinstance(tp_size, int) and tp_size >= 1, \
            f"--use-ascend-coc: --tensor-model-parallel-size (tp_size) must be a positive int, got {tp_size!r}"
        assert not model.get("use_ascend_mc2"), "--use-ascend-coc cannot be combined with --use-ascend-mc2"
        assert not num_experts, f"--use-ascend-coc does not support MoE (--num-experts {num_experts})"
        assert not model.get("tp_2d"), "--use-ascend-coc does not support 2-D tensor parallelism (--tp-2d)"
        transformer_impl = model.get("transformer_impl", "local")
        assert transformer_impl == "local", \
            f"--use-ascend-coc needs --transformer-impl local, got {transformer_impl!r}"
        assert not args.coc_fused_kernel, "--coc-fused-kernel: this implementation has no fused kernels"
        return MegatronStyleConfig(enabled=True, parallel_num=args.coc_parallel_num, fused_kernel=False,
                                   user_cfgs=_validate_user_cfgs(coc_cfgs))

    @contextmanager
    def patch_megatron(self, config: MegatronStyleConfig) -> Iterator[None]:
        """Replace the TP linear layers' ``forward`` for the block (restored on exit, also on exceptions).

        The chunk counts are bound now: ``parallel_num`` and ``customized_coc``
        are read once, here.  With CoC off, or nothing to cut into more than
        one chunk, megatron is left alone.
        """
        cfgs = config.user_cfgs
        customized = dict(cfgs.get("customized_coc") or {})
        chunked = config.parallel_num != 1 or any(c != 1 for c in customized.values())
        if not config.enabled or not chunked:
            yield
            return
        chunker = _Chunker(int(config.parallel_num), customized)
        keep_gathered = not cfgs.get("recompute_all_gather", True)
        originals = {cls: cls.__dict__["forward"] for cls in (ColumnParallelLinear, RowParallelLinear)}
        try:
            ColumnParallelLinear.forward = _make_column_forward(originals[ColumnParallelLinear], chunker,
                                                                keep_gathered)
            RowParallelLinear.forward = _make_row_forward(originals[RowParallelLinear], chunker)
            from coc_shared.megatron import cpu_device_redirect

            with cpu_device_redirect():
                yield
        finally:
            for cls, forward in originals.items():
                cls.forward = forward
