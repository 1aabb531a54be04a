"""The one entry point checks use to run a task on ranks.

:class:`RankRunner` leases devices, hands the task to the configured launcher,
turns rank errors into one failure with every rank's evidence, and records
where the case's time went (:class:`CaseTimings`: lease wait, pool start,
the implementation's and the references' time on the ranks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.harness.case import IMPL, REFERENCE, Budget, RankOutcome, RankTask, TaskFn
from conformance.harness.case_errors import RankRaised
from conformance.harness.launchers import Launcher
from conformance.harness.launchers.worker import CPU
from conformance.harness.leases import DeviceLeases


@dataclass
class CaseTimings:
    """Where one test's time went (seconds), summed over its rank runs."""

    lease_wait: float = 0.0
    longest_lease_wait: float = 0.0  #: the longest single wait (a case may lease several times)
    pool_start: float = 0.0  #: waiting for ranks to start (the case's own pool, or one started ahead of it)
    pools_started: int = 0  #: runs that waited for ranks to start
    ranks: float = 0.0  #: wall time of the launcher runs (the ranks' whole work)
    impl: float = 0.0  #: the implementation's calls (max over ranks, per run)
    reference: float = 0.0  #: the suite's own references on the ranks (max over ranks, per run)
    rank_cpu: float = 0.0  #: the ranks' CPU time for their tasks, summed over ranks and runs (process launcher)
    rank_cpu_max: float = 0.0  #: the same, the busiest rank's per run (what one run takes of one core at least)
    runs: int = 0
    total: float = 0.0  #: the whole test call (set by the time-breakdown plugin)
    world: int = 0  #: the ranks the case needs (``caseids.needs``; 0: none)
    exclusive: bool = False  #: whether it holds the whole node (a perf case)
    extra: dict[str, float] = field(default_factory=dict)
    #: Calls of torch_npu's fused kernels the implementation's calls reached, by kernel: the most any rank made,
    #: summed over runs (which fused backend ran; reported apart from the timings).
    fused_kernels: dict[str, int] = field(default_factory=dict)

    @property
    def checks(self) -> float:
        """The test's time outside the rank runs: checks, golden loading, reporting."""
        return max(0.0, self.total - self.lease_wait - self.ranks)

    def as_dict(self) -> dict[str, Any]:
        """The timings (:attr:`fused_kernels` left out)."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in
                {**asdict(self), "checks": self.checks}.items() if k != "fused_kernels"}


class RankRunner:
    """Leases devices and runs tasks on ranks for the whole session; each case sees it through :meth:`for_case`."""

    def __init__(self, launcher: Launcher, leases: DeviceLeases | None, impl_spec: str, *,
                 default_timeout: float = 60.0, budget: Budget | None = None,
                 device_thread_backward: bool = True) -> None:
        self.launcher = launcher
        self.leases = leases
        self.impl_spec = impl_spec
        self.default_timeout = default_timeout
        self.budget = budget or Budget()
        #: Whether CPU ranks run each backward on another thread (``RankContext.device_thread_backward``).
        self.device_thread_backward = device_thread_backward

    def for_case(self, timings: CaseTimings, before_run: Callable[[], None] | None = None, *,
                 exclusive: bool = False) -> CaseRanks:
        """This runner as one case uses it: every run records where its time went into ``timings``.

        ``before_run`` is called before each run and may refuse it by raising
        (the storm breaker fails a case there, once it is known to need ranks).
        ``exclusive``: every run of the case holds the whole node (a perf case).
        """
        return CaseRanks(self, timings, before_run, exclusive=exclusive)

    def outcomes(self, fn: TaskFn, world_size: int, *, timeout: float | None = None,
                 exclusive: bool = False, **params: Any) -> list[RankOutcome]:
        """Run ``fn(ctx, **params)`` on ``world_size`` ranks; one outcome per rank (timings not kept)."""
        return self.for_case(CaseTimings()).outcomes(fn, world_size, timeout=timeout, exclusive=exclusive, **params)

    def run(self, fn: TaskFn, world_size: int, *, timeout: float | None = None,
            exclusive: bool = False, **params: Any) -> list[Any]:
        """Like :meth:`outcomes` but returns the values, raising if any rank raised."""
        return self.for_case(CaseTimings()).run(fn, world_size, timeout=timeout, exclusive=exclusive, **params)


class CaseRanks:
    """The session's :class:`RankRunner` as one case sees it (the ``coc_ranks`` fixture)."""

    def __init__(self, runner: RankRunner, timings: CaseTimings,
                 before_run: Callable[[], None] | None = None, *, exclusive: bool = False) -> None:
        self.runner = runner
        self.timings = timings
        self.before_run = before_run
        self.exclusive = exclusive

    @property
    def max_world(self) -> int | None:
        """The most ranks one run can have on this node (None: no device limit)."""
        leases = self.runner.leases
        return None if leases is None else len(leases.devices)

    @property
    def relaunches(self) -> bool:
        """Whether a run can ask for fresh ranks (``fresh=True``): processes that ran no case before."""
        return bool(getattr(self.runner.launcher, "relaunches", False))

    def outcomes(self, fn: TaskFn, world_size: int, *, timeout: float | None = None,
                 exclusive: bool = False, fresh: bool = False, **params: Any) -> list[RankOutcome]:
        """Run ``fn(ctx, **params)`` on ``world_size`` ranks (``fresh``: ranks that ran no case before, where the
        launcher :attr:`relaunches`); one outcome per rank."""
        if self.before_run is not None:
            self.before_run()
        exclusive = exclusive or self.exclusive
        runner, record = self.runner, self.timings
        task = RankTask(fn, world_size, params, timeout or runner.default_timeout, exclusive, runner.budget,
                        runner.device_thread_backward, fresh=fresh and self.relaunches)
        if runner.leases is None:
            return self._run(task, ())
        prefer: Sequence[str] = getattr(runner.launcher, "preferred_devices", lambda _: ())(world_size)
        asked = time.perf_counter()
        with runner.leases.lease(world_size, exclusive=exclusive, prefer=prefer) as devices:
            waited = time.perf_counter() - asked
            record.lease_wait += waited
            record.longest_lease_wait = max(record.longest_lease_wait, waited)
            return self._run(task, devices[:world_size])

    def _run(self, task: RankTask, devices: Sequence[str]) -> list[RankOutcome]:
        launcher, record = self.runner.launcher, self.timings
        start = time.perf_counter()
        try:
            outcomes = launcher.run(task, devices, self.runner.impl_spec)
        finally:
            record.ranks += time.perf_counter() - start
            started = getattr(launcher, "last_start_s", None)
            if started:
                record.pool_start += started
                record.pools_started += 1
            record.runs += 1
        record.impl += max((o.timings.get(IMPL, 0.0) for o in outcomes), default=0.0)
        record.reference += max((o.timings.get(REFERENCE, 0.0) for o in outcomes), default=0.0)
        cpu = [o.timings.get(CPU, 0.0) for o in outcomes]
        record.rank_cpu += sum(cpu)
        record.rank_cpu_max += max(cpu, default=0.0)
        for kernel in sorted({k for o in outcomes for k in o.fused_kernels}):
            record.fused_kernels[kernel] = (record.fused_kernels.get(kernel, 0)
                                            + max(o.fused_kernels.get(kernel, 0) for o in outcomes))
        return outcomes

    def run(self, fn: TaskFn, world_size: int, *, timeout: float | None = None,
            exclusive: bool = False, fresh: bool = False, **params: Any) -> list[Any]:
        """Like :meth:`outcomes` but returns the values, raising if any rank raised."""
        outcomes = self.outcomes(fn, world_size, timeout=timeout, exclusive=exclusive, fresh=fresh, **params)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            first = failed[0].error
            assert first is not None
            raise RankRaised(
                f"rank(s) {[o.rank for o in failed]} raised; rank {failed[0].rank}: "
                f"{first.type_name}: {first.message}",
                outcomes=outcomes,
            )
        return [o.value for o in outcomes]
