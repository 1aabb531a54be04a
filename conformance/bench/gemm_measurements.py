"""The device check's GEMM measurements: whether a row's bits depend on the row count, and chunked-GEMM efficiency.

Each on the node's device, at an accelerator's or (where the device computes
on the host) a CPU's scale: :func:`measure_rows` (:mod:`coc_shared.gemm_rows`)
and :func:`measure_efficiency` (:mod:`coc_shared.chunk_efficiency`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coc_shared import gemm_rows
from coc_shared.chunk_efficiency import CHUNKS, ChunkEfficiency, ShapeEfficiency, chunk_ratio
from conformance.harness.launchers.devices import DeviceKind, node_identity

#: Per-rank matmuls ``(name, m, k, n)`` of Megatron layers at sequence 4096: Llama-2-7B at TP 1
#: (qkv, proj, fc1 of a gated MLP of 11008) and Llama-2-70B's proj and fc2 at TP 8.
ACCELERATOR_SHAPES = (("7b-qkv", 4096, 4096, 12288), ("7b-proj", 4096, 4096, 4096),
                      ("7b-fc1", 4096, 4096, 22016), ("70b-proj-tp8", 4096, 1024, 8192),
                      ("70b-fc2-tp8", 4096, 3584, 8192))
#: The same layers at a CPU's scale (sequence 1024, widths / 4), so the table takes seconds (on the emulated NPU node
#: too: its device computes on the host).
CPU_SHAPES = (("7b-qkv/4", 1024, 1024, 3072), ("7b-proj/4", 1024, 1024, 1024),
              ("70b-fc2-tp8/4", 1024, 896, 2048))
#: The GEMM rows measurement: ``(k, n)`` weights (``n`` a multiple of 16, as the reference pads it) and the rows
#: of the whole product, on an accelerator and on a CPU.
ACCELERATOR_ROWS = (((1024, 1024), (4096, 4096), (4096, 12288)), 4096)
CPU_ROWS = (((96, 64), (1024, 1024)), 2048)

def _in_chunks(x: Any, w: Any, chunks: int) -> None:
    """``x @ w`` as ``chunks`` row-chunks one after the other, a fresh output each (as a pipeline)."""
    import torch

    block = x.shape[0] // chunks
    for i in range(chunks):
        torch.matmul(x[i * block:(i + 1) * block], w)


def measure_efficiency(shapes: Sequence[tuple[str, int, int, int]], device: str, dtype: str, *,
                       chunks: Sequence[int] = CHUNKS, warmup: int = 2, repeats: int = 7) -> ChunkEfficiency:
    """Time every shape whole and in ``c`` row-chunks, interleaved, on ``device``; the ratios per shape."""
    import torch

    from coc_shared.timing import Settings, no_sync, time_interleaved

    torch_dtype = getattr(torch, dtype)
    sync: Callable[[], None] = torch.get_device_module(device).synchronize if device != "cpu" else no_sync
    measured = []
    gen = torch.Generator().manual_seed(0)
    for _, m, k, n in shapes:
        x = torch.randn(m, k, generator=gen).to(device=device, dtype=torch_dtype)
        w = torch.randn(k, n, generator=gen).to(device=device, dtype=torch_dtype)
        counts = [c for c in chunks if m % c == 0]

        items: dict[str, Callable[[], Any]] = {"whole": functools.partial(torch.matmul, x, w)}
        items.update({f"c{c}": functools.partial(_in_chunks, x, w, c) for c in counts})
        with torch.no_grad():
            samples = time_interleaved(items, Settings(warmup, repeats), barrier=lambda: None, synchronize=sync,
                                       max_over_ranks=lambda values: values)
        measured.append(ShapeEfficiency(m, k, n, {c: chunk_ratio(samples["whole"], samples[f"c{c}"])
                                                  for c in counts}))
    return ChunkEfficiency(tuple(measured), device.split(":")[0], dtype)


def measure_rows(kind: DeviceKind, path: Path) -> dict[str, Any]:
    """The GEMM rows measurement of the node's device, written to ``path`` for the sessions (``COC_GEMM_ROWS``), and
    whether the reference then declares split invariance on it."""
    from conformance.harness.impl_loader import load_implementation
    from conformance.options import DEFAULT_IMPL
    from conformance.protocol import declarations

    shapes, rows = CPU_ROWS if kind.computes_on_host else ACCELERATOR_ROWS
    device = "cpu" if kind.name == "cpu" else f"{kind.name}:0"
    measured = gemm_rows.measure(device, shapes, rows, name=node_identity(kind).get("name", ""))
    path.write_text(json.dumps({"gemm_rows": measured.to_dict()}, indent=1) + "\n")
    print(measured.text(), flush=True)
    before = os.environ.get(gemm_rows.ENV)
    os.environ[gemm_rows.ENV] = str(path)
    try:
        claims = bool(declarations(load_implementation(DEFAULT_IMPL), device=kind.name).split_invariant_ops)
    finally:
        if before is None:
            del os.environ[gemm_rows.ENV]
        else:
            os.environ[gemm_rows.ENV] = before
    return {**measured.to_dict(), "reference_claims_split_invariance": claims}
