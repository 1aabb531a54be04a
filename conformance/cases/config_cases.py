"""Rank-side tasks of the configuration checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.contract.results import ConfigOutcome
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.case import RankContext
from conformance.harness.probes import record_collectives


def configure_on_rank(ctx: RankContext, *, argv: list[str], env: Mapping[str, str],
                      kwargs: Mapping[str, Any]) -> ConfigOutcome:
    """Call ``configure`` on this rank; report the error it raised and the collectives issued."""
    ctx.budget_from(0.0)
    with record_collectives() as log:
        _, error = call_capturing_errors(ctx.impl.configure, argv, dict(env), **kwargs)
    return ConfigOutcome(error, tuple(c.op for c in log.calls))
