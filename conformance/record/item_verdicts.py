"""The record of the running case, in its pytest item's stash: one object the level gate and the report read.

The level gate writes its checks into it (the ``verdicts`` fixture, a failure raised from the test body) and
the reporting hooks keep its evidence (:attr:`~conformance.record.verdicts.Verdicts.evidence`) for the report.
"""

from __future__ import annotations

import pytest

from conformance.record.verdicts import Verdicts

verdicts_key = pytest.StashKey[Verdicts]()


def verdicts_of(item: pytest.Item) -> Verdicts:
    """The running case's record, made on first use."""
    return item.stash.setdefault(verdicts_key, Verdicts())
