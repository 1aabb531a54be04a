"""A case of the explorer as plain data: what every kind of spec offers.

A spec is small and frozen, so the same seed draws equal specs, a shrinker
compares them, and a minimal failing case is kept as a JSON file that
``--coc-replay`` turns back into the same case (``conformance/explore/finding.py``).  Each kind of case (an op's
calls, a layer's training, a configuration) is its own spec class in its own
module; this is what they share.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable
from typing import Any, Protocol


class SpecError(ValueError):
    """A spec that names no runnable case (unknown kind or op, sizes no TP split divides, a malformed file)."""


class Spec(Hashable, Protocol):
    """What the explorer, the shrinker and the finding files need of a spec of any kind."""

    @property
    def world(self) -> int:
        """Ranks the case runs on (0: in the test process)."""

    @property
    def tp(self) -> int:
        """Size of the TP group its ranks form (0: in the test process; ``--coc-tp`` filters on it)."""

    @property
    def capability(self) -> str:
        """What the storm breaker counts its hangs against (an op, the layers, configuration)."""

    def invalid(self) -> str:
        """Why this spec names no runnable case ("" when it does)."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON form, with ``kind`` naming its kind."""

    def describe(self) -> str:
        """One line a person reads: the case, its sizes and modes."""


class OnReplicas:
    """A spec whose case runs on ``replicas`` TP groups of ``tp`` ranks each (its ``world``)."""

    tp: int
    replicas: int

    @property
    def world(self) -> int:
        return self.tp * self.replicas


def require_runnable(spec: Spec) -> None:
    """Raise :class:`SpecError` saying why, where ``spec`` names no runnable case."""
    why = spec.invalid()
    if why:
        raise SpecError(why)


def spec_key(spec: Spec) -> str:
    """A short stable hash of ``spec`` (file names)."""
    return hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode()).hexdigest()[:10]
