"""What the emulated device costs per op: ``python -m npu_sim.overhead`` prints a table, CPU against npu.

Each row times one op on a CPU tensor and on the same tensor on the emulated ``npu`` (median of several
rounds, measured side by side in one process); the difference is the emulator's per-op overhead: torch's
dispatch into Python, unwrapping, the CPU kernel, wrapping the result.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch


def _per_call(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def _mlp_step(x: torch.Tensor, layers: list[torch.Tensor]) -> None:
    h = x
    for w in layers:
        h = torch.relu(h @ w)
    h.sum().backward()


def rows() -> list[tuple[str, Callable[[torch.Tensor], object], int]]:
    return [
        ("add (64x64 fp32)", lambda t: t.add(t), 2000),
        ("in-place add_", lambda t: t.add_(0), 2000),
        ("view + transpose", lambda t: t.view(-1).view(64, 64).t(), 2000),
        ("sum().item()", lambda t: t.sum().item(), 2000),
        ("mm (64x64 fp32)", lambda t: t @ t, 1000),
    ]


def main() -> None:
    from npu_sim import activate

    activate()
    torch.manual_seed(0)
    cpu = torch.randn(64, 64)
    npu = cpu.to("npu")
    print(f"{'op':24s} {'cpu us':>9s} {'npu us':>9s} {'overhead us':>12s} {'ratio':>7s}")
    for name, op, calls in rows():
        on_cpu = _per_call(functools.partial(op, cpu), calls) * 1e6
        on_npu = _per_call(functools.partial(op, npu), calls) * 1e6
        print(f"{name:24s} {on_cpu:9.2f} {on_npu:9.2f} {on_npu - on_cpu:12.2f} {on_npu / on_cpu:7.2f}")
    x_cpu = torch.randn(32, 256)
    layers_cpu = [torch.randn(256, 256, requires_grad=True) for _ in range(4)]
    x_npu = x_cpu.to("npu")
    layers_npu = [w.detach().to("npu").requires_grad_() for w in layers_cpu]
    on_cpu = _per_call(lambda: _mlp_step(x_cpu, layers_cpu), 50) * 1e6
    on_npu = _per_call(lambda: _mlp_step(x_npu, layers_npu), 50) * 1e6
    name = "4-layer MLP fwd+bwd"
    print(f"{name:24s} {on_cpu:9.2f} {on_npu:9.2f} {on_npu - on_cpu:12.2f} {on_npu / on_cpu:7.2f}")


if __name__ == "__main__":
    main()
