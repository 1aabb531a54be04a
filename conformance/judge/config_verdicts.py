"""The judging of one ``configure`` call: the settings in force, or the refusal, each at its level.

The fixed suite (``conformance/suite/test_config.py``) and the explorer
(``conformance/explore/config_settings.py``) both judge with these functions,
so a rule exists once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.contract.rank_errors import CapturedError
from conformance.judge import checks
from conformance.protocol import Declarations
from conformance.record.failures import WrongError
from conformance.record.levels import Level
from conformance.record.verdicts import NotJudged, Verdicts


def judge_effective(verdicts: Verdicts, config: Any, error: CapturedError | None, expect: Mapping[str, Any],
                    level: Level, what: str) -> None:
    """``configure`` accepted a valid setting and reports the ``expect``ed values in force."""
    with verdicts.check("effective settings", level):
        if error is not None:  # a refusal of a valid setting fails whatever there was to compare
            raise WrongError(f"{what}: configure refused a valid setting: {error.describe()}")
        if not expect:
            raise NotJudged(f"{what}: no setting's value in force is expected: nothing to compare")
        actual = {key: getattr(config, key, "<missing>") for key in expect}
        assert actual == dict(expect), f"{what}: expected {dict(expect)}, got {actual}"


def judge_refused(verdicts: Verdicts, error: CapturedError | None, declared: Declarations, *, names: str,
                  kind: str | None, level: Level, what: str, or_correct: bool = False) -> None:
    """``configure`` refused the setting naming it (``names``, a regex); the declared ``kind`` of error (SHOULD;
    ``kind`` None: several kinds apply, none judged).  ``or_correct``: accepting it is conforming when the
    results are right (results not run here), the refusal -- naming the setting, as any refusal -- a SHOULD."""
    if or_correct:
        with verdicts.check("a clear refusal, or correct results", Level.MUST):
            if error is None:
                raise NotJudged(f"{what} accepted: its results with this setting are not run by this suite")
            checks.check_refused_on_every_rank([error], what=what, patterns=[names])
        with verdicts.check("refused, naming the setting", Level.SHOULD):
            if error is None:
                raise WrongError(f"{what}: accepted; the feature documents a refusal", level=Level.SHOULD)
            checks.check_refused_on_every_rank([error], what=what, patterns=[names], level=Level.SHOULD)
    else:
        with verdicts.check("refused, naming the setting", level):
            checks.check_refused_on_every_rank([error], what=what, patterns=[names])
    if error is not None and kind is not None:
        with verdicts.check("declared error type", Level.SHOULD):
            checks.check_declared_error(error, declared.error_type(kind), kind=kind, what=what)
