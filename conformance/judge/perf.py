"""The measurement protocol of the perf gates (``docs/DESIGN.md#perf-gates``) and what it reports.

Timings on a shared machine drift (other processes, frequency scaling), so a
perf figure is only trustworthy as a *ratio measured side by side*:

* every item (serial, each CoC variant, the matmul alone, the collective
  alone, the per-block costs) is warmed up, then timed in rounds that
  interleave all items (A B C A B C ...), the order rotated every round so
  that no item always follows the same neighbour;
* each timed call starts after a barrier of the TP group and ends after the
  device finished; a sample is the **maximum over ranks** (the step is as
  slow as its slowest rank);
* a gain is ``1 - median(T_coc) / median(T_serial)``; next to it stands the
  median of the *paired* gains ``(serial_i - coc_i) / serial_i`` of the
  rounds (each pair ran back to back, so slow drift cancels in it) with a
  bootstrap confidence interval for that median: where the interval holds
  a threshold, a verdict against it is within the noise of the run.

Per CoC variant this module derives the reported figures: gain, overlap
efficiency ``(T_serial - T_coc) / (T_serial - max(T_mm, T_comm))``, exposed
communication ``T_coc - T_mm`` (the two-lane makespan is the matmul time plus
the communication the overlap failed to hide), and the two-lane pipeline
model's prediction (:func:`coc_shared.timeline.simulate`, the pipeline model,
fed with the per-block costs measured in the same run through
:class:`coc_shared.cost_curves.MeasuredCurve`) with its error.

On a CPU the collective's copies and reductions run on the same cores as the
matmul, so what overlap can hide depends on how much of the collective's time
is CPU work rather than waiting.  Where the rank side measured the CPU time
(:class:`CpuDemand`), the figures include it.

The rank side (building tensors, launching ops) lives in
:mod:`conformance.cases.perf_cases`; this module builds no tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coc_shared.cost_curves import MeasuredCurve
from coc_shared.timeline import Order, Timeline, simulate
from conformance.contract.perf_items import COMM, MM, SERIAL
from conformance.judge.perf_samples import Stats, median_ci, paired_gains
from conformance.record.report_properties import GATE_ENFORCED, GATE_REPORTED


def overlap_efficiency(t_serial: float, t_coc: float, t_mm: float, t_comm: float) -> float | None:
    """Share of the hideable time actually hidden (1 = perfect overlap, 0 = none).

    ``None`` when nothing can be hidden (``T_serial <= max(T_mm, T_comm)``).
    """
    hideable = t_serial - max(t_mm, t_comm)
    return (t_serial - t_coc) / hideable if hideable > 0 else None


def exposed_comm(t_coc: float, t_mm: float) -> float:
    """Communication left visible: the CoC time beyond the matmul alone."""
    return max(0.0, t_coc - t_mm)


def prediction_error(predicted: float, measured: float) -> float:
    """Signed relative error of a prediction (+0.1: predicted 10 % slower than measured)."""
    return (predicted - measured) / measured


def predict(blocks: Sequence[int], mm_at: Mapping[int, float], comm_at: Mapping[int, float],
            order: Order) -> Timeline:
    """The two-lane model of ``blocks`` with the measured per-block costs."""
    return simulate(blocks, MeasuredCurve.of(mm_at), MeasuredCurve.of(comm_at), order)


@dataclass(frozen=True)
class CpuDemand:
    """CPU time one call of the matmul and of the collective burn, summed over all ranks.

    Process CPU time (every thread, user and system) while each ran alone,
    with the number of ranks and of the cores they share.  Context for the
    figures, not a bound: a chunked collective's CPU cost differs from the
    whole one's (smaller buffers, other allocator paths).
    """

    mm_ms: float
    comm_ms: float
    ranks: int
    cores: int

    def busy(self, t_comm: float) -> float:
        """Share of the collective's wall time its ranks kept a core busy (1: pure CPU work)."""
        return self.comm_ms / (self.ranks * t_comm)


def cpu_demand(result: Mapping[str, Any]) -> CpuDemand | None:
    """The :class:`CpuDemand` a rank-side result carries (``None`` off CPU)."""
    cpu = result.get("cpu")
    return None if cpu is None else CpuDemand(cpu["mm_ms"], cpu["comm_ms"], int(cpu["ranks"]), int(cpu["cores"]))


@dataclass(frozen=True)
class VariantFigures:
    """Everything reported for one CoC variant against the serial run."""

    variant: str
    time: Stats
    gain: float
    paired_gains: Stats
    paired_samples: tuple[float, ...]
    overlap_efficiency: float | None
    exposed_comm_ms: float
    blocks: tuple[int, ...] | None
    predicted: Timeline | None

    @property
    def speedup(self) -> float:
        """``T_serial / T_coc`` (medians)."""
        return 1.0 / (1.0 - self.gain)

    @property
    def paired_gain_ci(self) -> tuple[float, float]:
        """:data:`CI_LEVEL` interval of the median paired gain."""
        return median_ci(self.paired_samples)

    @property
    def predicted_ms(self) -> float | None:
        return None if self.predicted is None else self.predicted.makespan

    @property
    def prediction_error(self) -> float | None:
        p = self.predicted_ms
        return None if p is None else prediction_error(p, self.time.median)

    def as_dict(self) -> dict[str, Any]:
        def r(value: float | None, digits: int = 4) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "t_ms": r(self.time.median, 3), "spread": r(self.time.spread),
            "gain": r(self.gain), "gain_q1": r(self.paired_gains.q1), "gain_q3": r(self.paired_gains.q3),
            "gain_paired": r(self.paired_gains.median), "gain_paired_ci": [r(v) for v in self.paired_gain_ci],
            "speedup": r(self.speedup), "overlap_efficiency": r(self.overlap_efficiency),
            "exposed_comm_ms": r(self.exposed_comm_ms, 3),
            "blocks": None if self.blocks is None else list(self.blocks),
            "predicted_ms": r(self.predicted_ms, 3), "prediction_error": r(self.prediction_error),
            # every round's paired gain: what a later run is compared with (conformance.gating.gate)
            "paired_gains": [round(g, 5) for g in self.paired_samples],
        }


@dataclass(frozen=True)
class Measurement:
    """The serial baseline, the matmul and collective alone, and every CoC variant."""

    serial: Stats
    mm: Stats
    comm: Stats
    variants: Mapping[str, VariantFigures]
    cpu: CpuDemand | None = None

    def as_dict(self) -> dict[str, Any]:
        cpu = {} if self.cpu is None else {
            "cpu_mm_ms": round(self.cpu.mm_ms, 3), "cpu_comm_ms": round(self.cpu.comm_ms, 3),
            "comm_cpu_busy": round(self.cpu.busy(self.comm.median), 4), "cores": self.cpu.cores,
        }
        return {
            "serial_ms": round(self.serial.median, 3), "serial_spread": round(self.serial.spread, 4),
            "mm_ms": round(self.mm.median, 3), "comm_ms": round(self.comm.median, 3), **cpu,
            "variants": {name: v.as_dict() for name, v in self.variants.items()},
        }


def summarize(samples: Mapping[str, Sequence[float]], blocks: Mapping[str, Sequence[int] | None],
              *, rows: int, order: Order, cpu: CpuDemand | None = None) -> Measurement:
    """Figures of every variant in ``blocks`` from the interleaved ``samples``.

    ``samples`` holds :data:`SERIAL`, :data:`MM`, :data:`COMM` (the whole
    ``rows``), one list per variant, and ``mm@b`` / ``comm@b`` for the block
    sizes the variants used.  ``blocks[variant]`` are the matmul rows of each
    block the variant ran (``None``: not observed, no prediction).  ``cpu``:
    the CPU demand the rank side measured, if any.
    """
    serial, mm, comm = (Stats.of(samples[key]) for key in (SERIAL, MM, COMM))
    mm_at = {rows: mm.median}
    comm_at = {rows: comm.median}
    for key, values in samples.items():
        what, _, size = key.partition("@")
        if size and what in (MM, COMM):
            (mm_at if what == MM else comm_at)[int(size)] = Stats.of(values).median
    variants = {}
    for variant, used in blocks.items():
        t = Stats.of(samples[variant])
        predicted = None
        if used and all(b in mm_at and b in comm_at for b in used):
            predicted = predict(used, mm_at, comm_at, order)
        paired = paired_gains(samples[SERIAL], samples[variant])
        variants[variant] = VariantFigures(
            variant=variant, time=t, gain=1.0 - t.median / serial.median,
            paired_gains=Stats.of(paired), paired_samples=tuple(paired),
            overlap_efficiency=overlap_efficiency(serial.median, t.median, mm.median, comm.median),
            exposed_comm_ms=exposed_comm(t.median, mm.median),
            blocks=None if used is None else tuple(used), predicted=predicted,
        )
    return Measurement(serial, mm, comm, variants, cpu)


@dataclass(frozen=True)
class Verdict:
    """A gate's outcome: enforced or only reported, and whether the figure met it."""

    enforced: bool
    met: bool | None  # None: no minimum to meet
    reason: str

    @property
    def failed(self) -> bool:
        return self.enforced and self.met is False

    @property
    def label(self) -> str:
        return GATE_ENFORCED if self.enforced else GATE_REPORTED


def judge(gain: float, min_gain: float | None, *, profile_matches: bool, why_not: str = "") -> Verdict:
    """A case passes when its gain exceeds ``min_gain``; only a matching profile enforces it."""
    if min_gain is None:
        return Verdict(False, None, "no minimum gain: figures reported only")
    met = gain > min_gain
    text = f"gain {gain:+.1%} {'>' if met else '<='} minimum {min_gain:+.1%}"
    if not profile_matches:
        return Verdict(False, met, f"{text}; profile not for this machine: {why_not or 'no match'}")
    return Verdict(True, met, text)


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else format(value, spec)


def table(measurement: Measurement, verdicts: Mapping[str, Verdict] | None = None) -> str:
    """A text table: serial, the matmul and collective alone, then one row per variant."""
    m = measurement
    w = max([13, *(len(name) for name in m.variants)])
    lines = [f"{'variant':<{w}} {'ms':>8} {'spread':>7} {'x serial':>8} {'gain':>7} {'paired gain [90% CI]':>25} "
             f"{'overlap':>7} {'exposed':>8} {'model ms':>8} {'model err':>9}  blocks"]
    for name, stats in ((SERIAL, m.serial), (MM, m.mm), (COMM, m.comm)):
        lines.append(f"{name:<{w}} {stats.median:>8.2f} {stats.spread:>7.1%}")
    for name, v in m.variants.items():
        low, high = v.paired_gain_ci
        paired = f"{v.paired_gains.median:+.1%} [{low:+.1%}, {high:+.1%}]"
        blocks = "-" if v.blocks is None else (
            f"{len(v.blocks)} x {v.blocks[0]}" if len(set(v.blocks)) == 1 else str(list(v.blocks)))
        line = (f"{name:<{w}} {v.time.median:>8.2f} {v.time.spread:>7.1%} {v.speedup:>7.3f}x "
                f"{v.gain:>+7.1%} {paired:>25} {_fmt(v.overlap_efficiency, '>7.2f', 7)} "
                f"{v.exposed_comm_ms:>8.2f} {_fmt(v.predicted_ms, '>8.2f', 8)} "
                f"{_fmt(v.prediction_error, '>+9.1%', 9)}  {blocks}")
        if verdicts and name in verdicts:
            line += f"  [{verdicts[name].label}: {verdicts[name].reason}]"
        lines.append(line)
    if m.cpu is not None:
        lines.append(
            f"cpu per call over the {m.cpu.ranks} ranks ({m.cpu.cores} cores): matmul {m.cpu.mm_ms:.1f} ms, "
            f"collective {m.cpu.comm_ms:.1f} ms (busy {m.cpu.busy(m.comm.median):.0%} of its time)")
    return "\n".join(lines)
