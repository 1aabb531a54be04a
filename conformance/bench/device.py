"""``python -m conformance.bench device``: the device check anyone with an accelerator runs (under 5 minutes).

On the node at hand, against the reference implementation
(``docs/DESIGN.md#the-device-check``):

1. the TP-1 suite (``pytest --pyargs conformance.suite --coc-tp 1 --coc-perf-figures``);
2. a 60 s exploration at TP 1 (``--coc-explore 60 --coc-tp 1``);
3. the shared-device cases: TP 2 op cases as two ranks on one device over
   gloo (``--coc-ranks-per-device 2``), where the node is an accelerator
   (on CPU, ranks share cores anyway: recorded as not run, saying so);
4. the chunked-GEMM efficiency of the device: for a few Megatron shapes,
   the time of ``c`` row-chunks (``c = 2, 4, 8, 16``) multiplied one after
   the other over the time of the whole product
   (:mod:`coc_shared.chunk_efficiency`).

It writes one JSON (``--out``, default ``reports/device-check.json``): the
node's identity, each part's outcome and figures, and the efficiency table
under ``chunk_efficiency`` -- the file the pipeline model and
``--coc-parallel-num auto`` read when ``COC_CHUNK_EFFICIENCY`` names it.
Exit status 1 when the suite or the exploration failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coc_shared.chunk_efficiency import CHUNKS, ChunkEfficiency, ShapeEfficiency, chunk_ratio
from conformance.harness.launchers.devices import detect_device_kind, node_identity

#: Per-rank matmuls ``(name, m, k, n)`` of Megatron layers at sequence 4096: Llama-2-7B at TP 1
#: (qkv, proj, fc1 of a gated MLP of 11008) and Llama-2-70B's proj and fc2 at TP 8.
ACCELERATOR_SHAPES = (("7b-qkv", 4096, 4096, 12288), ("7b-proj", 4096, 4096, 4096),
                      ("7b-fc1", 4096, 4096, 22016), ("70b-proj-tp8", 4096, 1024, 8192),
                      ("70b-fc2-tp8", 4096, 3584, 8192))
#: The same layers at a CPU's scale (sequence 1024, widths / 4), so the table takes seconds.
CPU_SHAPES = (("7b-qkv/4", 1024, 1024, 3072), ("7b-proj/4", 1024, 1024, 1024),
              ("70b-fc2-tp8/4", 1024, 896, 2048))
DEFAULT_OUT = Path("reports") / "device-check.json"


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


def _pytest(args: Sequence[str], summary: Path, timeout_s: float) -> dict[str, Any]:
    """One pytest session of the suite in a subprocess; its outcome counts from its JSON summary."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "conformance.suite",
               "--coc-summary", str(summary), *args]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
        code, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = None, f"timed out after {timeout_s:g} s\n{str(exc.stdout or '')[-3000:]}"
    record: dict[str, Any] = {"command": " ".join(command[2:]), "exit_code": code,
                              "seconds": round(time.monotonic() - started, 1)}
    try:
        doc = json.loads(summary.read_text())
    except (OSError, json.JSONDecodeError):
        record["output_tail"] = tail
        return record
    record["outcomes"] = doc.get("outcomes", {})
    record["failed"] = [c["id"] for c in doc.get("cases", []) if c["outcome"] in ("failed", "error")]
    record["skips_by_reason"] = doc.get("skips_by_reason", {})
    explored = next((c["explore"] for c in doc.get("cases", []) if "explore" in c), None)
    if explored is not None:
        record["explore"] = explored
    if code not in (0, 5):
        record["output_tail"] = tail
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench device", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the JSON written (default {DEFAULT_OUT})")
    parser.add_argument("--explore-seconds", type=float, default=60.0, help="the exploration's length (default 60)")
    parser.add_argument("--dtype", default=None, help="GEMM dtype (default bfloat16 on accelerators, float32 on CPU)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds of the efficiency table (default 7)")
    parser.add_argument("--only", choices=("suite", "explore", "shared", "efficiency"), action="append",
                        help="run only these parts (repeatable; default all)")
    args = parser.parse_args(argv)
    parts = set(args.only or ("suite", "explore", "shared", "efficiency"))
    started = time.monotonic()
    kind = detect_device_kind()
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"schema": 1, "node": {**node_identity(kind), "devices": kind.count},
                           "python": sys.version.split()[0]}
    try:
        import torch

        doc["torch"] = torch.__version__
    except ImportError:
        pass
    work = out.with_suffix(".parts")  # each pytest session's own JSON summary, kept beside the check's
    if parts - {"efficiency"}:
        work.mkdir(exist_ok=True)
    if "suite" in parts:
        # The perf cases too, for their figures: no profile enforces a gate on a node met for the first time.
        doc["suite"] = _pytest(["--coc-tp", "1", "-n", "0", "--coc-perf-figures"], work / "suite.json", 240)
        print(f"suite at TP 1: {doc['suite'].get('outcomes')} in {doc['suite']['seconds']} s", flush=True)
    if "explore" in parts:
        doc["explore"] = _pytest(["--coc-explore", f"{args.explore_seconds:g}", "--coc-tp", "1", "-n", "0",
                                  "--coc-explore-dir", str(work / "explore")],
                                 work / "explore.json", args.explore_seconds + 180)
        print(f"exploration at TP 1: {doc['explore'].get('outcomes')} in {doc['explore']['seconds']} s", flush=True)
    if "shared" in parts:
        if kind.name == "cpu":
            doc["shared_devices"] = {"ran": False, "why": "CPU ranks already share the cores: nothing to share"}
        else:
            doc["shared_devices"] = _pytest(["--coc-ranks-per-device", "2", "--coc-tp", "2", "-n", "0",
                                             "-k", "test_ops and not corner"], work / "shared.json", 240)
        print(f"shared devices: {doc['shared_devices'].get('outcomes', doc['shared_devices'].get('why'))}",
              flush=True)
    if "efficiency" in parts:
        device = "cpu" if kind.name == "cpu" else f"{kind.name}:0"
        dtype = args.dtype or ("float32" if kind.name == "cpu" else "bfloat16")
        shapes = CPU_SHAPES if kind.name == "cpu" else ACCELERATOR_SHAPES
        table = measure_efficiency(shapes, device, dtype, repeats=args.repeats)
        doc["chunk_efficiency"] = {**table.to_dict(), "names": [s[0] for s in shapes]}
        print(table.text([s[0] for s in shapes]), flush=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"device check written to {out} ({doc['seconds']} s); "
          f"COC_CHUNK_EFFICIENCY={out} gives its efficiency to the pipeline model and auto", flush=True)
    ran = [doc[p] for p in ("suite", "explore", "shared_devices") if "exit_code" in doc.get(p, {})]
    return 1 if any(r["exit_code"] not in (0, 5) or r.get("failed") for r in ran) else 0


if __name__ == "__main__":
    sys.exit(main())

