"""Every attempt of a case sorted by what came back of it: the one rule of what is judged when some call raised.

An *attempt* is one call of the implementation made on every rank of a case:
an op call under one tiling, one repeat of it; a patched layer's forward or
backward of one micro-batch of one step.  A case makes several, and an
implementation may refuse some of them and return the rest (a mode it lacks
for one tiling, a token count it does not take).  Every attempt is sorted by
what its ranks did (:func:`sort_attempt`):

* ``returned`` on every rank: judged by every check it can be judged by,
  whatever the other attempts did -- a wrong result beside a refusal is a
  wrong result;
* ``not offered``: every rank raised ``NotImplementedError`` -- that attempt,
  not the case, is not offered;
* ``raised`` otherwise: a refusal, judged as one where the case allows it, a
  failure of the check that every call runs where it does not.

A case is not offered only when every attempt it made is not offered: when
nothing at all came back (:attr:`Attempts.offered`).  The fixed suite, the
explorer and its replays judge ops, layers and training by this rule
(``conformance/judge/op_verdicts.py``, ``conformance/judge/layer_verdicts.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from conformance.contract.rank_errors import CapturedError
from conformance.judge.checks import not_implemented

RETURNED, NOT_OFFERED, RAISED = "returned", "not offered", "raised"

Label = TypeVar("Label", bound=Hashable)


def sort_attempt(errors: Sequence[CapturedError | None]) -> str:
    """What one attempt came to, from what it raised on each rank (None where it returned)."""
    if all(e is None for e in errors):
        return RETURNED
    return NOT_OFFERED if not_implemented(errors) else RAISED


@dataclass(frozen=True)
class Attempts(Generic[Label]):
    """A case's attempts, by label, sorted by :func:`sort_attempt` (each list in the case's order)."""

    returned: list[Label] = field(default_factory=list)
    not_offered: dict[Label, str] = field(default_factory=dict)  #: label -> why (the implementation's message)
    raised: dict[Label, list[CapturedError | None]] = field(default_factory=dict)  #: label -> each rank's error

    @property
    def offered(self) -> bool:
        """Whether anything came back, or was refused other than as not offered (else the case is not offered)."""
        return bool(self.returned or self.raised)


def sort_attempts(attempts: Mapping[Label, Sequence[CapturedError | None]]) -> Attempts[Label]:
    """Every attempt (label -> what it raised on each rank) sorted by :func:`sort_attempt`."""
    sorted_: Attempts[Label] = Attempts()
    for label, errors in attempts.items():
        kind = sort_attempt(errors)
        if kind == RETURNED:
            sorted_.returned.append(label)
        elif kind == NOT_OFFERED:
            sorted_.not_offered[label] = not_implemented(errors)
        else:
            sorted_.raised[label] = list(errors)
    return sorted_
