"""Rank-side timing of one matmul + collective pipeline, serial and CoC, side by side.

The pipeline is one of the fused ops (``op``) on a per-rank matmul
``[m, k] @ [k, n]`` (``m`` counts the gathered rows for ``all_gather_matmul``
and the rows before the scatter for ``matmul_reduce_scatter``).  Items timed
by the :mod:`conformance.judge.perf` protocol:

* ``serial``: the live serial composition of :mod:`conformance.cases.op_cases`
  (matmul, then the collective, or the reverse);
* ``fused``: the implementation's op;
* ``scripted-P`` / ``auto``: the megatron layer whose CoC path is exactly this
  pipeline (row-parallel forward for the all-reduce and, with SP, the
  reduce-scatter; column-parallel SP forward for the all-gather) under the
  implementation's ``patch_megatron`` with ``--coc-parallel-num P|auto``;
* ``serial-reused`` (a reference row, asked for like a variant): the serial
  composition into buffers kept from call to call.  A real layer returns a
  fresh output every call; on a CPU its pages fault in on first touch, a
  large part of a big matmul's time, so this row shows what skipping that
  alone saves, with no overlap at all (a loop timed with a persistent output
  buffer gains this much whatever it overlaps);
* ``mm`` / ``comm``: the matmul alone and the collective alone, for the whole
  ``m`` and (``mm@b`` / ``comm@b``) for every block size a variant used.  The
  matmul writes a fresh output, as the serial path and the pipelines do (on a
  CPU, faulting in a fresh output's pages is a visible part of its cost).

On a CPU device the case also measures the CPU time the matmul and the
collective burn (:class:`~conformance.judge.perf.CpuDemand`): the collective's
copies and reductions compete with the matmul for the same cores.

Every item multiplies the same weight storage (megatron's ``[out, in]``
shard) on the same process group.  Which blocks a variant used is observed,
not assumed: one untimed call under :func:`~conformance.harness.probes.record_collectives`
after warm-up (so ``auto`` has made its decision).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from coc_shared.timing import Settings, time_interleaved, warm_up
from conformance.cases.groups import TPPlace
from conformance.cases.pipeline_costs import cpu_demand, pipeline_operands
from conformance.cases.references import serial_composition
from conformance.contract.jobs import coc_argv
from conformance.contract.perf_items import COMM, MM, SERIAL, SERIAL_REUSED, block_key
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.case import RankContext
from conformance.harness.case import synchronize as synchronize_device
from conformance.harness.impl_loader import missing_capability
from conformance.harness.launchers.devices import cpu_name
from conformance.harness.launchers.npu_emulation import identity_device
from conformance.harness.probes import record_collectives

#: The collective each op pipelines (as :class:`~conformance.harness.probes.collective_log.CollectiveCall` kinds).
KINDS = {"matmul_all_reduce": "all_reduce", "matmul_reduce_scatter": "reduce_scatter",
         "all_gather_matmul": "all_gather"}


def device_identity(ctx: RankContext, backend: str) -> dict[str, Any]:
    """What a hardware profile matches on, as the ranks saw it: device kind, device name, backend, TP."""
    kind = ctx.device.split(":")[0]
    if kind == "cpu":
        name = cpu_name()
    else:
        import torch

        name = torch.get_device_module(kind).get_device_name()
    return {"device": identity_device(kind), "name": name, "backend": backend, "tp": ctx.world_size}


def variant_reason(impl: Any, variant: str, op: str) -> str | None:
    """Why the implementation cannot run ``variant`` (None when it can)."""
    if variant == SERIAL_REUSED:
        return None
    return missing_capability(impl, op if variant == "fused" else "patch_megatron")


def chunk_flag(variant: str) -> str:
    """``--coc-parallel-num`` of a scripted variant (``scripted-4`` -> ``4``, ``auto``)."""
    return "auto" if variant == "auto" else variant.removeprefix("scripted-")


def pipeline_perf_case(ctx: RankContext, *, op: str, m: int, k: int, n: int, dtype: str,
                       variants: list[str], warmup: int, repeats: int,
                       impl_specs: list[str] | None = None) -> dict[str, Any]:
    """Interleaved timings (ms, max over ranks) of serial, each variant and the costs alone.

    With several ``impl_specs`` every implementation's variants are timed in
    the same rounds against the same serial, named ``<implementation>:<variant>``.
    """
    import torch
    import torch.distributed as dist

    from coc_shared.megatron import model_parallel
    from conformance.harness.impl_loader import load_implementation

    tp = ctx.world_size
    impls = {impl.name: impl for impl in (load_implementation(spec) for spec in impl_specs or [ctx.impl_spec])}
    named = len(impls) > 1
    device = torch.device(ctx.device)
    wanted = [(f"{label}:{v}" if named else v, impl, v) for label, impl in impls.items() for v in variants]
    skipped = {key: r for key, impl, v in wanted if (r := variant_reason(impl, v, op)) is not None}
    runnable = [(key, impl, v) for key, impl, v in wanted if key not in skipped]
    sp = op != "matmul_all_reduce"

    with model_parallel(tp, sequence_parallel=sp, device=device) as par, torch.no_grad():
        group = par.group
        layer, x, costs = pipeline_operands(op, m, k, n, dtype, group=group, rank=ctx.rank, device=ctx.device)
        weight = layer.weight  # megatron's [out, in] shard, i.e. [n, k]
        w_kn = weight.t()
        x_layer = x.unsqueeze(1)  # [s, b=1, h]
        place = TPPlace(group, par.rank, 0, tuple(range(tp)))
        synchronize: Callable[[], None] = (
            torch.get_device_module(device).synchronize if device.type != "cpu" else _no_sync)

        items: dict[str, Callable[[], Any]] = {
            SERIAL: lambda: serial_composition(place, op, x, w_kn, None),
        }
        for key, impl, variant in runnable:
            if variant == SERIAL_REUSED:
                items[key] = costs.serial_reused
            elif variant == "fused":
                items[key] = partial(getattr(impl, op), x, weight, None, group=group, transpose_weight=True)
            else:
                config, refused = call_capturing_errors(impl.configure, coc_argv(chunk_flag(variant)), {},
                                                        tp_size=tp)
                if refused is not None:
                    skipped[key] = f"configure refused it: {refused.describe()}"
                    continue

                def patched(impl: Any = impl, config: Any = config) -> Any:
                    with impl.patch_megatron(config):
                        return layer(x_layer)

                items[key] = patched
        items[MM] = partial(costs.matmul, m)
        items[COMM] = partial(costs.collective, m)

        def barrier() -> None:
            dist.barrier(group=group)

        def max_over_ranks(values: list[float]) -> list[float]:
            # float32: HCCL reduces no float64 (milliseconds need no more than float32 holds)
            t = torch.tensor(values, dtype=torch.float32, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            return t.cpu().tolist()

        # Warm-up of everything (auto measures its costs here), then which blocks each variant uses;
        # each first call is where a broken implementation hangs, so each gets its own budget.
        armed = _armed_per_call(ctx, items)
        started = time.perf_counter()
        warm_up(armed, warmup, barrier=barrier, synchronize=synchronize)
        round_s = (time.perf_counter() - started) / max(1, warmup)
        blocks = {key: _observed_blocks(armed[key], KINDS[op], m) for key, _, _ in runnable if key in items}
        for size in sorted({b for used in blocks.values() if used for b in used} - {m}):
            items[block_key(MM, size)] = partial(costs.matmul, size)
            items[block_key(COMM, size)] = partial(costs.collective, size)
        # The timed rounds (one more warm-up, for the block items just added) run unwrapped, under
        # one budget from the warm-up round's time.
        ctx.budget_from(round_s, calls=repeats + 2)
        samples = time_interleaved(items, Settings(1, repeats), barrier=barrier,
                                   synchronize=synchronize, max_over_ranks=max_over_ranks)
        cpu = cpu_demand(items, group, calls=max(3, warmup)) if device.type == "cpu" else None
        identity = device_identity(ctx, dist.get_backend(group))
    return {"identity": identity, "samples": samples, "blocks": blocks, "skipped": skipped, "cpu": cpu}


def _armed_per_call(ctx: RankContext, items: dict[str, Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
    """``items`` wrapped so that each call re-arms the case's deadline at one call's budget.

    A perf case makes dozens of calls, so one budget for all of them would be no
    tighter than the ceiling.  Armed per call, from the serial path's time
    (measured here, after the floor), a call that hangs is declared within its
    own budget.
    """
    if ctx.budget is None:
        return items
    ctx.budget_from(0.0)
    synchronize_device(ctx.device)
    started = time.perf_counter()
    items[SERIAL]()
    synchronize_device(ctx.device)  # what ran on the device, not what was queued
    seconds = ctx.budget.seconds(time.perf_counter() - started)

    def armed(call: Callable[[], Any]) -> Callable[[], Any]:
        def within_budget() -> Any:
            ctx.expect_within(seconds)
            return call()
        return within_budget

    return {key: armed(call) for key, call in items.items()}


def _no_sync() -> None:
    """CPU work is finished when the call returns."""


def _observed_blocks(call: Callable[[], Any], kind: str, m: int) -> list[int] | None:
    """Matmul rows of each collective of ``kind`` one call issues (None if they do not cover ``m``)."""
    with record_collectives() as log:
        call()
    rows = [max(shape[0] for shape in c.shapes if shape) for c in log.of_kind(kind) if c.shapes]
    return rows if rows and sum(rows) == m else None
