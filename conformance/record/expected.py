"""One entry of an expectations file: what a user expects of some cases (or checks) of an implementation.

The file itself -- TOML, read and written by
:mod:`conformance.gating.expectations` -- lives with the gating tools; the
entry lives here because every consumer judges with it: the run's plugin
(``conformance.plugins.known_outcomes``: known failures, known skips), and
the comparison of two runs (:mod:`conformance.record.run_diff`: losses of
judgment a user expects), which ``coc-gate`` and the report both read.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.caseids import matches

#: What an entry expects: the check fails, the case hangs, the case is not run (whole cases only), or the case
#: or check may go unjudged (skipped, not offered, not judged, missing) without that being a change.
FAIL, HANG, SKIP, UNJUDGED = "fail", "hang", "skip", "unjudged"
OUTCOMES = (FAIL, HANG, SKIP, UNJUDGED)
#: The outcomes that say how a check *fails* (the known failures of a run).
FAILING = (FAIL, HANG)


@dataclass(frozen=True)
class Expectation:
    pattern: str
    outcome: str
    reason: str
    link: str = ""
    check: str = ""  #: fnmatch pattern on a check's name ("": any check)
    level: str = ""  #: a check's level ("": any level)
    #: Where the entry is written, ``file:line`` (entries loaded from a file); not part of what it says.
    source: str = field(default="", compare=False)

    def describe(self) -> str:
        return self.reason + (f" ({self.link})" if self.link else "")

    @property
    def whole_case(self) -> bool:
        """Whether the entry covers every check of its cases (it names no check and no level)."""
        return not (self.check or self.level)

    def matches(self, case: str) -> bool:
        """Whether the entry's pattern matches the case id."""
        return matches(case, self.pattern)

    def covers(self, check: Mapping[str, Any]) -> bool:
        """Whether the entry names ``check`` (a check as the report carries it: name, level ...)."""
        return (not self.check or fnmatch.fnmatchcase(str(check["name"]), self.check)) and \
            (not self.level or str(check["level"]) == self.level)

    def as_dict(self) -> dict[str, str]:
        return {key: value for key, value in asdict(self).items() if value}


def stale(entries: Sequence[Expectation], cases: Mapping[str, Sequence[str]]) -> list[str]:
    """Each entry of an expectations file that says nothing about a run, and why (``"<source or pattern>: why"``):
    its pattern matches no case of the run (``cases``: case id -> the names of the checks it recorded), or its
    ``check`` pattern matches no check its cases recorded (judged only where one of them recorded any)."""
    found = []
    for entry in entries:
        where = entry.source or repr(entry.pattern)
        matched = [cid for cid in cases if entry.matches(cid)]
        if not matched:
            found.append(f"{where}: pattern {entry.pattern!r} matches no case of the run")
            continue
        names = [name for cid in matched for name in cases[cid]]
        if entry.check and names and not any(fnmatch.fnmatchcase(name, entry.check) for name in names):
            found.append(f"{where}: check {entry.check!r} names no check its {len(matched)} case(s) recorded")
    return found
