"""The one entry point checks use to run a case on ranks.

:class:`RankRunner` leases devices, hands the case to the configured launcher
and turns rank errors into one failure with every rank's evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.case import Case, CaseFn, RankOutcome
from conformance.errors import RankRaised
from conformance.launchers import Launcher
from conformance.leases import DeviceLeases


class RankRunner:
    def __init__(self, launcher: Launcher, leases: DeviceLeases | None, impl_spec: str, *,
                 default_timeout: float = 60.0) -> None:
        self.launcher = launcher
        self.leases = leases
        self.impl_spec = impl_spec
        self.default_timeout = default_timeout

    def outcomes(self, fn: CaseFn, world_size: int, *, timeout: float | None = None,
                 exclusive: bool = False, **params: Any) -> list[RankOutcome]:
        """Run ``fn(ctx, **params)`` on ``world_size`` ranks; one outcome per rank."""
        case = Case(fn, world_size, params, timeout or self.default_timeout, exclusive)
        if self.leases is None:
            return self.launcher.run(case, (), self.impl_spec)
        prefer: Sequence[str] = getattr(self.launcher, "preferred_devices", lambda _: ())(world_size)
        with self.leases.lease(world_size, exclusive=exclusive, prefer=prefer) as devices:
            return self.launcher.run(case, devices[:world_size], self.impl_spec)

    def run(self, fn: CaseFn, world_size: int, *, timeout: float | None = None,
            exclusive: bool = False, **params: Any) -> list[Any]:
        """Like :meth:`outcomes` but returns the values, raising if any rank raised."""
        outcomes = self.outcomes(fn, world_size, timeout=timeout, exclusive=exclusive, **params)
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
