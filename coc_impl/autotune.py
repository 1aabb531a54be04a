"""``--coc-parallel-num auto``: the chunk count that the live device's measured costs favour.

Once per shape (cached per process) every rank of the TP group measures, on
the live backend and device:

* ``CostMM(b)``: the matmul of ``b`` rows, and ``CostComm(b)``: the
  collective of those ``b`` rows, for the whole ``m`` and for each candidate
  block ``b = m/p``.  The model is evaluated at exactly these sizes, so it
  runs on the measured points (:class:`~coc_shared.cost_curves.MeasuredCurve`), not on a fit: a line
  through noisy timings can go negative at small blocks;
* ``T2(b)``: the real two-block pipeline of the overlap engine on ``2b``
  rows (blocks ``[b, b]``): one overlapped step, with everything the engine
  does per block.

The two-lane model (:func:`coc_shared.timeline.simulate`) assumes lanes that do
not slow each other and blocks that cost nothing beyond their matmul and
collective; the MC2 method covers the contention of overlapped lanes with a fixed
inflation of 1.15 (Ascend).  Both are properties of the device: on CPU,
gloo's reduction and copies run on the very cores doing the matmul, and
fresh block buffers cost page faults.  So they are measured: the excess of
``T2(b)`` over the model's two-block makespan is charged to each of the
``p - 1`` overlapped steps of a ``p``-block pipeline::

    predicted(p) = makespan(p) + (p - 1) * max(0, T2(b) - makespan([b, b]))

With ``COC_CHUNK_EFFICIENCY`` naming the device check's JSON
(:mod:`coc_shared.chunk_efficiency`), a block's matmul is not timed: its cost
is the whole matmul's share times the device's measured chunk penalty.

The count with the best prediction is a candidate if it beats the serial
run (``CostMM(m) + CostComm(m)``) by at least :data:`MIN_PREDICTED_GAIN`.
A candidate is then confirmed: its real pipeline on all ``m`` rows and the
one-block pipeline are timed, interleaved, and the candidate is used only if
the median of its per-round time ratios is at least :data:`MIN_CONFIRMED_GAIN`
faster; else 1 (no CoC).  The
model picks among the counts, the confirmation guards "never slower than
serial" where timings are noisy (a shared CPU) or the model is off.

Collective safety: every rank runs the same measurement (same sizes, same
order, a barrier before each timed call) and the timings are combined with
one all-reduce MAX, so every rank reaches the same decision; ranks that hit
the cache do so together, because they see the same shapes in the same
order.  The measurement issues collectives on ``group``: call it only where
none of this rank's collectives on ``group`` is in flight (the scripted
layers ask for their chunk count before launching anything).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from coc_impl import overlap
from coc_impl.block_product import Product
from coc_impl.comm_lane import InFlight
from coc_impl.config_sources import VALID_CHUNKS
from coc_shared import chunk_efficiency, timing
from coc_shared.chunk_efficiency import ChunkedMatmul, ChunkEfficiency
from coc_shared.cost_curves import CostCurve, MeasuredCurve
from coc_shared.timeline import Order, simulate

Collective = Literal["all_reduce", "reduce_scatter", "all_gather"]
ORDERS: dict[str, Order] = {
    "all_reduce": "compute_first", "reduce_scatter": "compute_first", "all_gather": "comm_first",
}
#: Smallest predicted gain over serial worth confirming.
MIN_PREDICTED_GAIN = 0.05
#: Smallest measured gain of the candidate over one block for it to be used.
MIN_CONFIRMED_GAIN = 0.03
WARMUP = 1
REPEATS = 5
#: Interleaved rounds of the confirmation (candidate vs. one block).
CONFIRM_REPEATS = 7


@dataclass(frozen=True)
class Decision:
    """The chunk count chosen for one shape and what it was chosen from (microseconds)."""

    chunks: int
    serial_us: float
    predicted_us: dict[int, float]  # per feasible chunk count > 1
    mm_us: dict[int, float] = dataclasses.field(default_factory=dict)  # CostMM per measured row count
    comm_us: dict[int, float] = dataclasses.field(default_factory=dict)  # CostComm per measured row count
    candidate: int = 1  # the model's pick (before confirmation)
    confirmed_us: tuple[float, float] | None = None  # (one block, candidate) when confirmed

    def gain(self, chunks: int) -> float:
        """Predicted fractional saving of ``chunks`` over the serial run."""
        if chunks == 1:
            return 0.0
        return 1.0 - self.predicted_us[chunks] / self.serial_us


_decisions: dict[tuple[object, ...], Decision] = {}


def clear_cache() -> None:
    _decisions.clear()


def choose_chunks(
    m: int, k: int, n: int, *, group: dist.ProcessGroup, dtype: torch.dtype,
    collective: Collective, device: torch.device | str = "cpu",
    candidates: Sequence[int] = VALID_CHUNKS,
) -> int:
    """Chunk count for the matmul ``[m, k] @ [k, n]`` pipelined with ``collective`` over ``group``.

    ``m`` is the matmul's row count on the rank (for ``reduce_scatter`` and
    ``all_gather``: ``tp`` times the shard).  Only counts that split the
    pipeline's rows exactly are considered, so the answer never breaks a
    shape rule.  Collective: every rank of ``group`` must call it with the
    same arguments (see the module docstring).
    """
    return decide(m, k, n, group=group, dtype=dtype, collective=collective, device=device,
                  candidates=candidates).chunks


def decide(
    m: int, k: int, n: int, *, group: dist.ProcessGroup, dtype: torch.dtype,
    collective: Collective, device: torch.device | str = "cpu",
    candidates: Sequence[int] = VALID_CHUNKS,
) -> Decision:
    """The cached :class:`Decision` for this shape (measured on first use)."""
    if collective not in ORDERS:
        raise ValueError(f"collective must be one of {sorted(ORDERS)}, got {collective!r}")
    device = torch.device(device)
    tp = group.size()
    key = (m, k, n, dtype, collective, device.type, tuple(dist.get_process_group_ranks(group)),
           tuple(candidates))
    if key not in _decisions:
        counts = _feasible(m, tp, collective, candidates)
        _decisions[key] = _measure_and_plan(m, k, n, group, dtype, collective, device, counts)
    return _decisions[key]


def _feasible(m: int, tp: int, collective: Collective, candidates: Sequence[int]) -> list[int]:
    """Chunk counts > 1 that split the pipeline's rows into equal, non-empty blocks."""
    if collective != "all_reduce" and m % tp:
        return []
    split = m if collective == "all_reduce" else m // tp
    return sorted({p for p in candidates if p > 1 and split % p == 0})


def predicted_time(chunks: int, mm: CostCurve, comm: CostCurve, order: Order, m: int,
                   two_blocks_us: float) -> float:
    """The two-lane makespan of ``chunks`` equal blocks plus the measured excess per overlapped step."""
    block = m // chunks
    makespan = simulate((block,) * chunks, mm, comm, order).makespan
    excess = max(0.0, two_blocks_us - simulate((block, block), mm, comm, order).makespan)
    return makespan + (chunks - 1) * excess


def plan(mm_us: Mapping[int, float], comm_us: Mapping[int, float], two_blocks_us: Mapping[int, float],
         *, m: int, collective: Collective, efficiency: ChunkEfficiency | None = None,
         k: int = 1, n: int = 1) -> Decision:
    """Pick the chunk count from measured costs (pure: no device, no collective).

    ``mm_us`` / ``comm_us`` map matmul row counts (``m`` and each candidate
    block) to the matmul and collective times measured for them;
    ``two_blocks_us[p]`` is the engine's two-block pipeline of the block size
    of candidate ``p``.  With the device's chunk ``efficiency`` (the device
    check's table) only the whole matmul need be measured: a block of
    ``m/p`` rows costs ``ratio(p) * CostMM(m) / p`` for the ``[m, k] @ [k, n]``
    shape's nearest measured shape.
    """
    mm: CostCurve = MeasuredCurve.of(mm_us)
    if efficiency is not None:
        mm = ChunkedMatmul(MeasuredCurve.of({m: mm_us[m]}), m, k, n, efficiency)
    comm = MeasuredCurve.of(comm_us)
    serial = mm_us[m] + comm_us[m]
    order = ORDERS[collective]
    predicted = {}
    for p in sorted(two_blocks_us):
        try:
            predicted[p] = predicted_time(p, mm, comm, order, m, two_blocks_us[p])
        except ValueError:  # a cost the measurements cannot support: no prediction, no candidate
            continue
    best = min(predicted, key=predicted.__getitem__, default=1)
    chunks = best if predicted and 1 - predicted[best] / serial >= MIN_PREDICTED_GAIN else 1
    return Decision(chunks, serial, predicted, dict(mm_us), dict(comm_us), candidate=chunks)


def confirm(decision: Decision, one_block_us: Sequence[float], candidate_us: Sequence[float]) -> Decision:
    """Keep the candidate only if its pipeline beats one block by :data:`MIN_CONFIRMED_GAIN`.

    Judged on the median ratio of the rounds (each pair ran back to back, so
    drift of a shared machine cancels in it).
    """
    ratio = statistics.median(c / o for o, c in zip(one_block_us, candidate_us, strict=True))
    kept = decision.candidate if ratio <= 1 - MIN_CONFIRMED_GAIN else 1
    medians = (statistics.median(one_block_us), statistics.median(candidate_us))
    return dataclasses.replace(decision, chunks=kept, confirmed_us=medians)


def _measure_and_plan(m: int, k: int, n: int, group: dist.ProcessGroup, dtype: torch.dtype,
                      collective: Collective, device: torch.device, counts: list[int]) -> Decision:
    if not counts:
        return Decision(1, 0.0, {})
    rows = [m] + [m // p for p in counts]
    efficiency = chunk_efficiency.configured()  # the device check's table: blocks' matmuls need no timing
    probe = _Probe(m, k, n, group, dtype, collective, device)
    items: dict[str, Callable[[], None]] = {}
    for r in rows:
        if efficiency is None or r == m:
            items[f"mm@{r}"] = functools.partial(probe.matmul, r)
        items[f"comm@{r}"] = functools.partial(probe.collective, r)
    for p in counts:
        items[f"two@{p}"] = functools.partial(probe.two_blocks, m // p)
    with torch.no_grad():
        us = {name: ms * 1e3 for name, ms in probe.medians(items, REPEATS).items()}
    decision = plan({r: us[f"mm@{r}"] for r in rows if f"mm@{r}" in us}, {r: us[f"comm@{r}"] for r in rows},
                    {p: us[f"two@{p}"] for p in counts}, m=m, collective=collective, efficiency=efficiency,
                    k=k, n=n)
    if decision.candidate == 1:
        return decision
    race: dict[str, Callable[[], None]] = {"one": functools.partial(probe.pipeline, m, 1),
            "many": functools.partial(probe.pipeline, m // decision.candidate, decision.candidate)}
    with torch.no_grad():
        rounds = probe.samples(race, CONFIRM_REPEATS)
    return confirm(decision, [ms * 1e3 for ms in rounds["one"]], [ms * 1e3 for ms in rounds["many"]])


class _Probe:
    """Buffers of the largest size and the timed calls on their leading rows.

    Collectives go through :mod:`coc_impl.overlap`, the engine the pipelines
    use, so they run on the same lane (a side stream on accelerators).
    """

    def __init__(self, m: int, k: int, n: int, group: dist.ProcessGroup, dtype: torch.dtype,
                 collective: Collective, device: torch.device) -> None:
        self.group, self.collective_kind, self.tp = group, collective, group.size()
        # A private generator: the measurement must not shift the caller's random stream.
        gen = torch.Generator().manual_seed(0)

        def rand(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

        self.x, self.w = rand(m, k), rand(k, n)
        self.device = device
        width = k if collective == "all_gather" else n
        self.sent = rand(m, width)  # what the collective moves (a different buffer from the matmul's)
        self.received = torch.empty(m, width, dtype=dtype, device=device)
        self._sync: Callable[[], None] = (
            torch.get_device_module(device).synchronize if device.type != "cpu" else timing.no_sync)

    def matmul(self, rows: int) -> None:
        torch.matmul(self.x[:rows], self.w)  # a fresh output, as the layers' matmuls

    def launch(self, rows: int) -> InFlight[torch.Tensor]:
        if self.collective_kind == "all_reduce":
            return overlap.matmul_all_reduce(self.sent[:rows], None, [rows], self.group, out=self.sent[:rows])
        shard = rows // self.tp
        if self.collective_kind == "reduce_scatter":
            return overlap.matmul_reduce_scatter(self.sent[:rows], None, [shard], self.group, out=self.received[:shard])
        return overlap.all_gather(self.sent[:shard], [shard], self.group, out=self.received[:rows])

    def collective(self, rows: int) -> None:
        self.launch(rows).wait()

    def pipeline(self, rows: int, count: int) -> None:
        """The engine's pipeline of ``count`` blocks of ``rows`` rows, as the scripted layers run it."""
        multiply = Product(self.w)
        total = rows * count
        if self.collective_kind == "all_reduce":
            overlap.matmul_all_reduce(self.x[:total], multiply, [rows] * count, self.group).wait()
            return
        shards = [rows // self.tp] * count
        if self.collective_kind == "reduce_scatter":
            overlap.matmul_reduce_scatter(self.x[:total], multiply, shards, self.group).wait()
        else:
            overlap.all_gather_matmul(self.sent[: total // self.tp], multiply, shards, self.group)

    def two_blocks(self, rows: int) -> None:
        self.pipeline(rows, 2)

    def samples(self, items: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
        """Milliseconds per item and round, interleaved, each the slowest rank's (every rank agrees)."""
        group, device = self.group, self.device

        def slowest(values: list[float]) -> list[float]:
            # float32: HCCL reduces no float64 (milliseconds need no more than float32 holds)
            agreed = torch.tensor(values, dtype=torch.float32, device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)  # one decision on every rank
            return agreed.cpu().tolist()

        return timing.time_interleaved(items, timing.Settings(WARMUP, repeats),
                                       barrier=lambda: dist.barrier(group=group),
                                       synchronize=self._sync, max_over_ranks=slowest)

    def medians(self, items: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
        return timing.medians(self.samples(items, repeats))
