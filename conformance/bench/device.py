"""``python -m conformance.bench device``: the device check anyone with an accelerator runs (minutes).

On the node at hand, against the reference implementation
(``docs/DESIGN.md#the-device-check``):

1. ``gemm_rows``: whether the device's float32 GEMM gives a row the same bits
   at any row count (:mod:`coc_shared.gemm_rows`) -- what decides whether the
   reference may declare split invariance there.  Measured first: every
   session below runs with ``COC_GEMM_ROWS`` naming the measurement;
2. ``suite``: the TP-1 suite (``--coc-tp 1 --coc-perf-figures``);
3. ``explore``: a 60 s exploration at TP 2 (two ranks on one device where
   the node has one);
4. ``shared`` (GPUs): the whole suite but the perf cases at TP 2, 4 and 8 with
   up to 8 ranks on each device over gloo (``--coc-ranks-per-device 8``);
   ``tp`` (NPUs, where HCCL takes one rank per card and gloo no NPU tensors):
   the same at the TP sizes the node's own cards hold, one rank per card;
5. ``hangs``: device-side progress evidence: a rank whose host waits while its
   device works for several budgets passes, a deadlock on the device is
   declared at its budget (:func:`conformance.bench.hangs.on_device`);
6. ``efficiency``: the chunked-GEMM efficiency of the device: for a few
   Megatron shapes, the time of ``c`` row-chunks (``c = 2, 4, 8, 16``)
   multiplied one after the other over the time of the whole product
   (:mod:`coc_shared.chunk_efficiency`).

On a CPU, the parts only an accelerator can run (4 and 5) are recorded as
not run, saying why; so is the part of 4 another device kind runs.  A node
whose accelerators this Python cannot see (``/dev/davinci*`` without an
importable torch_npu, ``NPU_SIM`` set, ``/dev/nvidia*`` without a CUDA torch)
fails the check at once, naming what it found: it never measures the CPU
in their place.  It writes one JSON (``--out``, default
``reports/device-check.json``): the node's identity, each part's outcome and
figures, the measurement under ``gemm_rows`` and the efficiency table under
``chunk_efficiency`` -- the file ``COC_GEMM_ROWS`` and ``COC_CHUNK_EFFICIENCY``
may name.  Exit status 1 when a suite session, the exploration or a hang
verdict failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coc_shared import gemm_rows
from conformance.bench.gemm_measurements import ACCELERATOR_SHAPES, CPU_SHAPES, measure_efficiency, measure_rows
from conformance.harness.launchers.devices import (
    DeviceKind,
    SharedDevicesError,
    detect_device_kind,
    node_identity,
    shared,
)

DEFAULT_OUT = Path("reports") / "device-check.json"
#: Every part, in the order it runs.
PARTS = ("gemm_rows", "suite", "explore", "shared", "tp", "hangs", "efficiency")
#: The TP sizes of the shared-device and one-rank-per-card parts, and the most ranks ``shared`` puts on one device.
SHARED_TP = "2,4,8"
SHARED_RANKS_PER_DEVICE = 8
#: Where a node's accelerators show as device files, whether or not this Python can use them.
DEV = Path("/dev")
DEVICE_FILES = {"npu": "davinci[0-9]*", "cuda": "nvidia[0-9]*"}
#: The emulated NPU node's switch: set, the node has NPUs.
NPU_SIM = "NPU_SIM"
#: Budget of the device hang cases, and how long the device-bound one runs (several budgets).
HANG_BUDGET_FLOOR_S = 1.0
DEVICE_BOUND_S = 6.0


def _pytest(args: Sequence[str], summary: Path, timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One pytest session of the suite in a subprocess; its outcome counts from its JSON summary."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "conformance.suite",
               "--coc-summary", str(summary), *args]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env={**os.environ, **(env or {})})
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


def sessions(kind: DeviceKind, work: Path, explore_s: float) -> dict[str, tuple[list[str], Path, float]]:
    """The pytest sessions of the check on ``kind``: part -> (arguments, its JSON summary, its time limit).

    TP > 1 runs where the node lets it: on GPUs up to eight ranks share each device over gloo (``shared``); on
    NPUs, where HCCL takes one rank per card and gloo no NPU tensors, at the TP sizes the cards hold, one rank
    per card (``tp``; the exploration at TP 1 on a one-card node).  On a CPU neither: CPU ranks share the cores
    already, and CI runs every TP size.
    """
    shares = kind.name == "cuda"
    explore_ranks = ["--coc-ranks-per-device", "2"] if shares and kind.count < 2 else []
    explore_tp = "1" if kind.name == "npu" and kind.count < 2 else "2"
    found = {
        # The perf cases too, for their figures: no profile enforces a gate on a node met for the first time.
        "suite": (["--coc-tp", "1", "-n", "0", "--coc-perf-figures"], work / "suite.json", 240.0),
        "explore": (["--coc-explore", f"{explore_s:g}", "--coc-tp", explore_tp, "-n", "0", *explore_ranks,
                     "--coc-explore-dir", str(work / "explore")], work / "explore.json", explore_s + 180),
    }
    if shares:
        found["shared"] = (["--coc-ranks-per-device", str(SHARED_RANKS_PER_DEVICE), "--coc-tp", SHARED_TP,
                            "-m", "not perf", "-n", "4"], work / "shared.json", 600.0)
    held = [tp for tp in SHARED_TP.split(",") if int(tp) <= kind.count]
    if kind.name == "npu" and held:
        # A TP-2 case holds two cards: more workers than pairs of cards only wait for leases.
        found["tp"] = (["--coc-tp", ",".join(held), "-m", "not perf", "-n", str(kind.count // 2)],
                       work / "tp.json", 600.0)
    return found


#: Why a part did not run on a CPU.
NOT_ON_CPU = {
    "shared": "CPU ranks already share the cores: nothing to share (CI runs the suite at every TP size on CPU)",
    "tp": "CI runs the suite at every TP size on CPU",
    "hangs": "device events are inert on CPU ranks, whose evidence is CPU time and stacks "
             "(python -m conformance.bench hangs)",
}


def not_planned(kind: DeviceKind, part: str) -> str:
    """Why ``part``, a session :func:`sessions` does not plan on an accelerator ``kind``, did not run."""
    if part == "shared":
        return (f"ranks cannot share a {kind.name} device (HCCL takes one rank per card, gloo no NPU tensors): "
                "the tp part runs TP 2-8 on the node's own cards")
    if part == "tp" and kind.name == "npu":
        return f"one {kind.name} card: TP > 1 needs two, one rank per card"
    return f"the shared part runs TP {SHARED_TP} on this node's {kind.name} devices"


def unseen_accelerator(kind: DeviceKind) -> str | None:
    """Why this check would measure the wrong device: the node has accelerators ``kind`` (what this Python
    detected) is not, or None."""
    if kind.name != "cpu":
        return None
    if os.environ.get(NPU_SIM, "") not in ("", "0"):
        return (f"{NPU_SIM}={os.environ[NPU_SIM]} asks for the emulated NPU node, but this Python sees no NPU "
                "(is the emulator installed in this environment?)")
    for name, pattern in DEVICE_FILES.items():
        found = sorted(str(f) for f in DEV.glob(pattern))
        if found:
            need = ("an importable torch_npu (the node's torch and torch_npu, CANN's set_env.sh sourced)"
                    if name == "npu" else "a torch built with CUDA")
            return (f"this node has {name} devices ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}) but "
                    f"this Python sees none: it needs {need}; not measuring the CPU in their place")
    return None


def _two_ranks(kind: DeviceKind) -> tuple[DeviceKind, list[str]] | str:
    """Two ranks on the node's devices (sharing one where it has one), or why not."""
    if kind.count >= 2:
        return kind, kind.lease_names()[:2]
    try:
        two = shared(kind, 2)
    except SharedDevicesError as exc:
        return f"one {kind.name} device, and two ranks cannot share it: {exc}"
    return two, two.lease_names()[:2]


def hang_evidence(kind: DeviceKind) -> dict[str, Any]:
    """The device hang cases on two ranks: what each did and what its verdict got wrong (``problems``)."""
    from conformance.bench.hangs import device_problems, on_device
    from conformance.harness.case import Budget
    from conformance.harness.launchers.process_launcher import ProcessLauncher

    placed = _two_ranks(kind)
    if isinstance(placed, str):
        return {"ran": False, "why": placed}
    ranks_kind, devices = placed
    launcher = ProcessLauncher(ranks_kind, max_live_ranks=2)
    try:
        run = on_device(launcher, devices, Budget(factor=20, floor=HANG_BUDGET_FLOOR_S), seconds=DEVICE_BOUND_S)
    finally:
        launcher.close()
    return {"ran": True, "budget_s": run.budget_s, "device_bound_s": round(run.bound.seconds, 1),
            "deadlock_s": round(run.deadlock.seconds, 1), "problems": device_problems(run)}


def failed(doc: dict[str, Any]) -> list[str]:
    """The parts of a check's document that failed: a session's exit or cases, or a hang verdict."""
    bad = [part for part in PARTS if "exit_code" in doc.get(part, {})
           and (doc[part]["exit_code"] not in (0, 5) or doc[part].get("failed"))]
    return bad + (["hangs"] if doc.get("hangs", {}).get("problems") else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench device", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the JSON written (default {DEFAULT_OUT})")
    parser.add_argument("--explore-seconds", type=float, default=60.0, help="the exploration's length (default 60)")
    parser.add_argument("--dtype", default=None, help="GEMM dtype (default bfloat16 on accelerators, float32 on CPU)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds of the efficiency table (default 7)")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only these parts (repeatable; default all)")
    args = parser.parse_args(argv)
    parts = [part for part in PARTS if part in set(args.only or PARTS)]
    started = time.monotonic()
    kind = detect_device_kind()
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"schema": 2, "node": {**node_identity(kind), "devices": kind.count},
                           "python": sys.version.split()[0]}
    try:
        import torch

        doc["torch"] = torch.__version__
    except ImportError:
        pass
    node = doc["node"]
    print(f"measuring {node['device']} {node['name']!r} x{node['devices']} ({node['backend']})", flush=True)
    unseen = unseen_accelerator(kind)
    if unseen:
        doc.update(error=unseen, failed_parts=["node"])
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"device check failed: {unseen}", flush=True)
        return 1
    work = out.with_suffix(".parts")  # each pytest session's own JSON summary, kept beside the check's
    work.mkdir(exist_ok=True)
    env: dict[str, str] = {}
    planned = sessions(kind, work, args.explore_seconds)
    for part in parts:
        if part == "gemm_rows":
            doc[part] = measure_rows(kind, work / "gemm-rows.json")
            env[gemm_rows.ENV] = str(work / "gemm-rows.json")
        elif part == "efficiency":
            device = "cpu" if kind.name == "cpu" else f"{kind.name}:0"
            dtype = args.dtype or ("float32" if kind.name == "cpu" else "bfloat16")
            shapes = CPU_SHAPES if kind.computes_on_host else ACCELERATOR_SHAPES
            table = measure_efficiency(shapes, device, dtype, repeats=args.repeats)
            doc["chunk_efficiency"] = {**table.to_dict(), "names": [s[0] for s in shapes]}
            print(table.text([s[0] for s in shapes]), flush=True)
        elif kind.name == "cpu" and part in NOT_ON_CPU:
            doc[part] = {"ran": False, "why": NOT_ON_CPU[part]}
        elif part == "hangs":
            doc[part] = hang_evidence(kind)
        elif part not in planned:
            doc[part] = {"ran": False, "why": not_planned(kind, part)}
        else:
            doc[part] = _pytest(*planned[part], env=env)
        shown = doc.get(part, {})
        print(f"{part}: " + str(shown.get("outcomes", shown.get("why", shown.get("problems", "done")))) +
              (f" in {shown['seconds']} s" if "seconds" in shown else ""), flush=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["failed_parts"] = failed(doc)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"device check written to {out} ({doc['seconds']} s); COC_GEMM_ROWS={out} and "
          f"COC_CHUNK_EFFICIENCY={out} give its measurements to the reference, the pipeline model and auto"
          + (f"; failed: {', '.join(doc['failed_parts'])}" if doc["failed_parts"] else ""), flush=True)
    return 1 if doc["failed_parts"] else 0


if __name__ == "__main__":
    sys.exit(main())

