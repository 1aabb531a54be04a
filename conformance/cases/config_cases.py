"""Rank-side cases for configuration checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.case import CaseContext
from conformance.probes import record_collectives


def configure_on_rank(ctx: CaseContext, *, argv: list[str], env: Mapping[str, str],
                      kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Call ``configure`` on this rank; report the error it raised and the collectives issued."""
    with record_collectives() as log:
        try:
            ctx.impl.configure(argv, dict(env), **kwargs)
            error: tuple[str, str, list[str]] | None = None
        except Exception as exc:  # noqa: BLE001 - the error is the result
            error = (type(exc).__qualname__, str(exc), [c.__name__ for c in type(exc).__mro__])
    return {"error": error, "collectives": [c.op for c in log.calls]}
