"""``python -m conformance.bench coc``: serial vs every CoC variant, per shape and TP size.

For each shape of a hardware profile (default ``cpu-gloo``) and each TP size
(default 2 and 4, gloo ranks with one torch thread each), the
:mod:`conformance.judge.perf` protocol times side by side, in one rank pool:
serial, scripted CoC with 2 / 4 / 8 chunks, ``--coc-parallel-num auto``,
the implementation's fused op with its own plan, the matmul alone and the
collective alone, and the reference row ``serial-reused`` (serial into
buffers kept across calls: what skipping fresh outputs saves without any
overlap).  Per variant the table shows time, gain, overlap
efficiency, exposed communication, the pipeline model's prediction and its
error, and the blocks the variant was observed to use.  Then the harness
overhead figures of :mod:`conformance.bench.overhead` and the targets.

A shape whose target verdict sits within the noise of its rounds is
measured again (``--resample`` times) and judged on the pooled rounds, as the
suite's gates measure a miss once more.

Several implementations side by side: ``--coc-impl A --coc-impl B`` times
every implementation's variants in the same interleaved rounds against the
same serial (named ``<implementation>:<variant>``), so "reference vs
MindSpeed" is one table with paired gains and intervals for each.

Only ratios measured in the same run mean anything on a shared machine; the
absolute times move with whatever else runs.  The last line is one JSON
object with every figure, keyed by shape, TP and variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from conformance.bench import overhead
from conformance.cases.perf_cases import pipeline_perf_case
from conformance.contract.perf_items import SERIAL_REUSED
from conformance.harness.case import RankTask
from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.judge import hardware, perf, perf_samples

VARIANTS = ("scripted-2", "scripted-4", "scripted-8", "auto", "fused", SERIAL_REUSED)
#: Target 1: the best scripted chunk count on the balanced all-reduce shape at TP 2.
BALANCED = ("balanced-ar", 2)
MIN_BEST_SCRIPTED_SPEEDUP = 1.10
#: Target 2: ``auto`` is never slower than serial by more than this, on any shape.
MAX_AUTO_SLOWDOWN = 0.03
#: ``--shipped``: the reference and every adapter of ``conformance.adapters`` (those whose implementation loads here).
SHIPPED = (overhead.IMPL, "conformance.adapters.mindspeed:MindSpeedCoC",
           "conformance.adapters.colossalai:ColossalAIRing", "conformance.adapters.torch_async_tp:TorchAsyncTP")


def _shapes(profile: hardware.Profile, wanted: Sequence[str] | None) -> dict[str, hardware.PerfCase]:
    """One case per shape id of the profile, in profile order."""
    shapes: dict[str, hardware.PerfCase] = {}
    for case in profile.cases:
        shapes.setdefault(case.id, case)
    if wanted:
        unknown = sorted(set(wanted) - shapes.keys())
        if unknown:
            raise SystemExit(f"unknown shape(s) {unknown}; {profile.name} has {sorted(shapes)}")
        shapes = {name: shapes[name] for name in wanted}
    return shapes


def _speedup(gain: float) -> float:
    return 1.0 / (1.0 - gain)


def _certainty(ci: Sequence[float], threshold: float) -> str:
    """``clear`` when the whole confidence interval lies on one side of ``threshold``."""
    low, high = ci
    return "clear" if low >= threshold or high < threshold else "within the noise of this run"


def targets(figures: dict[str, dict[str, dict[str, Any]]], prefix: str = "") -> dict[str, dict[str, Any]]:
    """The benchmark's targets, met or missed, with the figures they were judged on.

    Each is judged on the median *paired* gain (each pair of calls ran back to
    back) and says whether its confidence interval clears the threshold.
    ``prefix`` (``"<implementation>:"``) picks one implementation's variants
    of a side-by-side run.
    """
    if prefix:
        figures = {shape: {tp: {**f, "variants": {v.removeprefix(prefix): x for v, x in f["variants"].items()
                                                  if v.startswith(prefix)}}
                           for tp, f in by_tp.items()} for shape, by_tp in figures.items()}
    out: dict[str, dict[str, Any]] = {}
    shape, tp = BALANCED
    balanced = figures.get(shape, {}).get(f"tp{tp}")
    if balanced is not None:
        scripted = {v: f for v, f in balanced["variants"].items() if v.startswith("scripted-")}
        if scripted:
            best = max(scripted, key=lambda v: scripted[v]["gain_paired"])
            figure, want = scripted[best], 1 - 1 / MIN_BEST_SCRIPTED_SPEEDUP
            out["best_scripted_balanced_tp2"] = {
                "met": figure["gain_paired"] >= want, "want": f">= {MIN_BEST_SCRIPTED_SPEEDUP}x",
                "variant": best, "speedup": round(_speedup(figure["gain_paired"]), 4),
                "speedup_ci": [round(_speedup(g), 4) for g in figure["gain_paired_ci"]],
                "certainty": _certainty(figure["gain_paired_ci"], want),
                # how much of the all-reduce is CPU work competing with the matmul (perf.CpuDemand)
                "comm_cpu_busy": balanced.get("comm_cpu_busy"),
            }
    autos = {f"{shape}@{tp}": f["variants"]["auto"] for shape, by_tp in figures.items()
             for tp, f in by_tp.items() if "auto" in f["variants"]}
    if autos:
        floor = -MAX_AUTO_SLOWDOWN
        worst = min(autos, key=lambda key: autos[key]["gain_paired"])
        out["auto_never_slower"] = {
            "met": all(a["gain_paired"] >= floor for a in autos.values()),
            "want": f"auto gain >= -{MAX_AUTO_SLOWDOWN:.0%} on every shape", "worst": worst,
            "worst_gain": autos[worst]["gain_paired"], "worst_gain_ci": autos[worst]["gain_paired_ci"],
            "certainty": _certainty(autos[worst]["gain_paired_ci"], floor),
            "worst_blocks": autos[worst].get("blocks"),
            "clearly_slower": sorted(k for k, a in autos.items() if a["gain_paired_ci"][1] < floor),
        }
    return out


def _measure(launcher: ProcessLauncher, task: RankTask, impl: str) -> dict[str, Any]:
    """One interleaved measurement on the ranks (rank 0's result: every figure is a max over ranks)."""
    outcome = launcher.run(task, (), impl)
    failed = [o for o in outcome if not o.ok]
    if failed:
        raise SystemExit(f"{task.params.get('op')} TP {task.world_size}: rank {failed[0].rank} raised:\n"
                         f"{failed[0].error.traceback if failed[0].error else ''}")
    return outcome[0].value


def _summary(result: dict[str, Any], case: hardware.PerfCase) -> perf.Measurement:
    return perf.summarize(result["samples"], result["blocks"], rows=case.m, order=case.order,
                          cpu=perf.cpu_demand(result))


def all_targets(figures: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """:func:`targets` of every implementation of a run (``"<implementation>: <target>"`` side by side)."""
    labels = sorted({v.split(":", 1)[0] for by_tp in figures.values() for f in by_tp.values()
                     for v in f["variants"] if ":" in v})
    if not labels:
        return targets(figures)
    return {f"{label}: {goal}": verdict for label in labels for goal, verdict in targets(figures, f"{label}:").items()}


def _undecided(name: str, tp: int, measurement: perf.Measurement) -> bool:
    """Whether a target judged on this shape sits within the noise of the rounds so far."""
    goals = all_targets({name: {f"tp{tp}": measurement.as_dict()}})
    return any(goal["certainty"] != "clear" for goal in goals.values())


def _overhead(launcher: ProcessLauncher, world_size: int, cases: int, spawns: int) -> dict[str, float]:
    """The foundation benchmark's per-case figures at ``world_size`` (warm pool vs. spawning)."""
    pool_ms = overhead.pool_per_case_ms(launcher, RankTask(overhead.empty_case, world_size), cases)
    allreduce_ms = overhead.pool_per_case_ms(launcher, RankTask(overhead.tiny_case, world_size), cases)
    spawn_ms = statistics.median(overhead.spawn_per_case_ms(world_size) for _ in range(spawns))
    return {"pool_ms": round(pool_ms, 3), "pool_allreduce_ms": round(allreduce_ms, 3),
            "spawn_ms": round(spawn_ms, 1)}


def shipped() -> list[str]:
    """The :data:`SHIPPED` implementations that load here; each one that does not is named, with why."""
    from conformance.harness.impl_loader import ImplementationLoadError, load_implementation

    found = []
    for spec in SHIPPED:
        try:
            load_implementation(spec)
        except ImplementationLoadError as exc:
            print(f"not benchmarked: {exc}")
        else:
            found.append(spec)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench coc", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu-gloo", help="hardware profile whose shapes to run")
    parser.add_argument("--shapes", default="", help="comma-separated shape ids (default: all of the profile)")
    parser.add_argument("--tp", default="2,4", help="TP sizes (default 2,4)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30, help="interleaved rounds per shape")
    parser.add_argument("--resample", type=int, default=1,
                        help="extra measurements (pooled) of a shape whose target verdict is within the noise")
    parser.add_argument("--coc-impl", "--impl", dest="impls", action="append", metavar="MODULE:ATTR",
                        help="implementation under test (module:attr); repeat to compare several side by side "
                             f"(default {overhead.IMPL})")
    parser.add_argument("--overhead-cases", type=int, default=30, help="pool cases per TP (0: skip overhead)")
    parser.add_argument("--spawns", type=int, default=1, help="spawned cases per TP for the overhead figures")
    parser.add_argument("--shipped", action="store_true",
                        help="add the reference and every shipped adapter whose implementation is available here "
                             "(MindSpeed with MINDSPEED_SRC, ColossalAI installed or COLOSSALAI_SRC, torch async-TP)")
    args = parser.parse_args(argv)
    impls = list(dict.fromkeys([*(shipped() if args.shipped else []), *(args.impls or [])])) or [overhead.IMPL]

    profile = hardware.by_name(args.profile)
    shapes = _shapes(profile, [s for s in args.shapes.split(",") if s])
    tps = [int(t) for t in args.tp.split(",") if t]
    variants = [v for v in args.variants.split(",") if v]
    launcher = ProcessLauncher(cpu(max(tps)), max_live_ranks=max(tps))
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    costs: dict[str, dict[str, float]] = {}
    identity: dict[str, Any] = {}
    load_before = os.getloadavg()[0]  # other work on the machine shows in the spreads
    start = time.perf_counter()
    try:
        for tp in tps:
            for name, case in shapes.items():
                params = dict(op=case.op, m=case.m, k=case.k, n=case.n, dtype=case.dtype,
                              variants=variants, warmup=args.warmup, repeats=args.repeats, impl_specs=impls)
                result = _measure(launcher, RankTask(pipeline_perf_case, tp, params, timeout=1800.0), impls[0])
                measurement = _summary(result, case)
                rounds = args.repeats
                for _ in range(args.resample):
                    if not _undecided(name, tp, measurement):
                        break
                    again = _measure(launcher, RankTask(pipeline_perf_case, tp, params, timeout=1800.0), impls[0])
                    result = {**result, "samples": perf_samples.pooled(result["samples"], again["samples"])}
                    measurement, rounds = _summary(result, case), rounds + args.repeats
                identity = result["identity"]
                print(f"\n== {name}: {case.op} [{case.m}, {case.k}] @ [{case.k}, {case.n}] {case.dtype}, "
                      f"TP {tp} ({identity['device']} {identity['name']!r}, {identity['backend']}, "
                      f"{rounds} rounds)")
                print(perf.table(measurement))
                for variant, reason in result["skipped"].items():
                    print(f"{variant}: not measured: {reason}")
                figures.setdefault(name, {})[f"tp{tp}"] = {
                    **measurement.as_dict(), "shape": case.shape(), "skipped": result["skipped"],
                }
            if args.overhead_cases:
                costs[str(tp)] = _overhead(launcher, tp, args.overhead_cases, args.spawns)
    finally:
        launcher.close()

    if costs:
        print(f"\n== harness overhead per case (conformance.bench overhead)\n"
              f"{'world':>5} {'pool ms':>9} {'pool+allreduce ms':>18} {'spawn ms':>9}")
        for world, c in costs.items():
            print(f"{world:>5} {c['pool_ms']:>9.3f} {c['pool_allreduce_ms']:>18.3f} {c['spawn_ms']:>9.1f}")
    goals = all_targets(figures)
    print("\n== targets")
    for goal, verdict in goals.items():
        detail = ", ".join(f"{k}={v}" for k, v in verdict.items() if k != "met")
        print(f"{goal}: {'met' if verdict['met'] else 'MISSED'} ({detail})")
    load = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
    print(f"bench time {time.perf_counter() - start:.0f} s; 1-min load average {load['before']} before, "
          f"{load['after']} after ({os.cpu_count()} CPUs)")
    print(json.dumps({"machine": {**identity, "cpus": os.cpu_count(), "load_avg": load},
                      "impl": impls, "profile": profile.name,
                      "settings": {"warmup": args.warmup, "repeats": args.repeats, "threads_per_rank": 1},
                      "shapes": figures, "overhead": costs, "targets": goals}))
    return 0
