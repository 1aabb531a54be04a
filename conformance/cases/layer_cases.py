"""Rank-side cases for the Megatron layer checks (SPEC §1, §3).

One case builds the real megatron.core layers of a golden case on this rank,
runs them unpatched (the live serial reference in the same dtype) and then
under the implementation's ``patch_megatron`` (the CoC result), forward and
backward, and returns this rank's pieces of every tensor with the collectives
each phase issued.  Megatron is reached through ``coc_impl.megatron_adapter``,
the environment adapter (CPU device redirect, parallel state), not through the
implementation under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conformance.case import CaseContext
from conformance.layouts import layout, shard
from conformance.probes import record_collectives


def coc_argv(chunks: int | str) -> list[str]:
    """Flags that enable scripted CoC with ``chunks`` chunks."""
    return ["--use-ascend-coc", "--coc-parallel-num", str(chunks)]


def _build(layer: str, golden_case: Any, sp: bool, dtype: Any, tp: int) -> tuple[Any, dict[str, Any]]:
    """The megatron module(s) of ``layer`` with the golden weights; params by golden name."""
    import torch

    from coc_impl.megatron_adapter import build_column, build_row

    p = golden_case.params
    bias = p["with_bias"]

    def tensor(name: str) -> Any:
        return golden_case.tensor(name, dtype=dtype) if name in golden_case.inputs else None

    if layer == "column":
        module = build_column(p["h_in"], p["h_out"], bias=bias, sequence_parallel=sp, dtype=dtype,
                              weight=tensor("w"), bias_value=tensor("b"))
        return module, {"w": module.weight, "b": module.bias}
    if layer == "row":
        module = build_row(p["h_in"], p["h_out"], bias=bias, sequence_parallel=sp, dtype=dtype,
                           weight=tensor("w"), bias_value=tensor("b"))
        return module, {"w": module.weight, "b": module.bias}
    fc1 = build_column(p["h_in"], p["ffn"], bias=bias, sequence_parallel=sp, dtype=dtype,
                       weight=tensor("w1"), bias_value=tensor("b1"))
    fc2 = build_row(p["ffn"], p["h_out"], bias=bias, sequence_parallel=sp, dtype=dtype,
                    weight=tensor("w2"), bias_value=tensor("b2"))

    class _Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = fc1, fc2

        def forward(self, x: Any) -> tuple[Any, None]:
            h, _ = self.fc1(x)
            return self.fc2(torch.nn.functional.gelu(h))  # exact (erf) gelu, as the golden

    return _Mlp(), {"w1": fc1.weight, "b1": fc1.bias, "w2": fc2.weight, "b2": fc2.bias}


def _run_once(module: Any, params: Mapping[str, Any], x: Any, dy: Any) -> dict[str, Any]:
    for param in params.values():
        if param is not None:
            param.grad = None
    x = x.detach().clone().requires_grad_(True)
    with record_collectives() as fwd:
        y, _ = module(x)
    with record_collectives() as bwd:
        y.backward(dy)
    result = {"y": y.detach().clone(), "dx": x.grad.detach().clone()}
    for name, param in params.items():
        if param is not None:
            result["d" + name] = param.grad.detach().clone()
    result["collectives"] = {
        "forward": [(c.kind, c.overlappable) for c in fwd.calls],
        "backward": [(c.kind, c.overlappable) for c in bwd.calls],
    }
    return result


def layer_case(ctx: CaseContext, *, case_id: str, chunks: int | str, runs: int = 1,
               serial: bool = True, coc_cfgs: Mapping[str, Any] | None = None,
               argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Serial and CoC results of one golden layer case on this rank (``runs`` CoC repeats).

    ``argv`` configures the implementation (default: :func:`coc_argv` of ``chunks``).
    """
    import golden
    from coc_impl.megatron_adapter import model_parallel

    g = golden.load(case_id)
    layer, sp, tp = g.params["layer"], g.params["sequence_parallel"], ctx.world_size
    dtype = g.dtype
    splits = layout(layer, sp)
    kwargs: dict[str, Any] = {"tp_size": tp}
    if coc_cfgs is not None:
        kwargs["coc_cfgs"] = dict(coc_cfgs)
    config = ctx.impl.configure(coc_argv(chunks) if argv is None else list(argv), {}, **kwargs)
    x = shard(g.tensor("x", dtype=dtype), splits["x"], ctx.rank, tp)
    dy = shard(g.tensor("dy", dtype=dtype), splits["dy"], ctx.rank, tp)
    with model_parallel(tp, sequence_parallel=sp):
        module, params = _build(layer, g, sp, dtype, tp)
        out: dict[str, Any] = {}
        if serial:
            out["serial"] = _run_once(module, params, x, dy)
        with ctx.impl.patch_megatron(config):
            out["coc"] = [_run_once(module, params, x, dy) for _ in range(runs)]
    return out


def shape_rule_case(ctx: CaseContext, *, layer: str, sp: bool, s: int, b: int, h: int,
                    chunks: int) -> dict[str, Any]:
    """Run one layer on ``s*b`` tokens under ``chunks`` chunks; report the outcome.

    Returns the error the patched layer raised (type names of its MRO and the
    message), the UserWarnings and WARNING log records it emitted, how many
    collectives it issued, and -- when it ran -- its output and the serial one.
    """
    import logging
    import warnings

    import torch

    from coc_impl.megatron_adapter import build_column, build_row, model_parallel

    tp = ctx.world_size
    config = ctx.impl.configure(coc_argv(chunks), {}, tp_size=tp)
    generator = torch.Generator().manual_seed(1234)
    splits = layout(layer, sp)
    x = shard(torch.randn(s, b, h * (1 if layer == "column" else tp), generator=generator),
              splits["x"], ctx.rank, tp)
    logged: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    with model_parallel(tp, sequence_parallel=sp):
        build = build_column if layer == "column" else build_row
        torch.manual_seed(0)
        module = build(h, h * tp, sequence_parallel=sp) if layer == "column" else build(
            h * tp, h, sequence_parallel=sp)
        serial, _ = module(x)
        logging.getLogger().addHandler(handler)
        try:
            with warnings.catch_warnings(record=True) as caught, record_collectives() as log:
                warnings.simplefilter("always")
                with ctx.impl.patch_megatron(config):
                    try:
                        y, _ = module(x.clone().requires_grad_(True))
                        y.backward(torch.ones_like(y))
                        error = None
                    except Exception as exc:  # noqa: BLE001 - the error is the result
                        y, error = None, ([c.__name__ for c in type(exc).__mro__], str(exc))
        finally:
            logging.getLogger().removeHandler(handler)
    return {
        "error": error,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)] + logged,
        "collectives": len(log.calls),
        "y": None if y is None else y.detach(),
        "serial": serial.detach(),
    }
