"""A finding: a minimal failing case the explorer found, and the one file form a finding and a corpus entry share.

A :class:`Finding` is what the explorer found and how; its file names what failed (``check``, ``subject``, ``level``,
``category``, ``message``), the case (``spec``, which ``--coc-replay`` and
a corpus turn back into the same case, and ``case``, the line a person
reads), whether it is ``minimal``, and where it came from (``provenance``:
the seed, the date, the implementation explored -- as its ``--coc-impl``
spec, data in the file, never parsed back out of a command -- and what it
was kept from).  The explorer adds how it found it (:data:`RUN_DETAILS`:
the shrink's figures, the command that replays it: :func:`write_finding`); a
corpus keeps the rest (:func:`kept`), and the shipped corpus is written by the
same :func:`document`.  Files of schema 2 (written before a finding carried its
provenance) still read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from conformance.explore.kind import FailureKey
from conformance.explore.registry import spec_from_dict
from conformance.explore.spec import Spec, SpecError, spec_key

#: Version of the file's form (a replay refuses one it does not read).
SCHEMA = 3
#: The versions read: schema 2's corpus entries are this form; its explorer findings held their seed alone.
READS = (2, SCHEMA)
#: What an exploration adds of how it found a case (a corpus, keeping the case, leaves them out).
RUN_DETAILS = ("name", "proof", "unproved", "first_failing_case", "found_after_s", "cases_before", "shrink_steps",
               "shrink_cases", "shrink_s", "budget_s", "path", "command")


@dataclass
class Finding:
    """A minimal failing case and how it was found."""

    key: FailureKey
    spec: Spec
    message: str
    minimal: bool
    found_after_s: float
    cases_before: int
    first_spec: Spec
    shrink_steps: int = 0
    shrink_tried: int = 0
    shrink_s: float = 0.0
    path: str = ""
    command: str = ""
    unproved: tuple[str, ...] = ()  #: why some neighbour of the case proves nothing (minimal within reach)
    cut_short: bool = False  #: shrinking's share of the budget ran out

    @property
    def proof(self) -> str:
        """What is proved of the case: minimal, minimal within reach (and why), or shrinking cut short."""
        if self.cut_short:
            return "shrinking cut short by the time budget, not proved minimal"
        if self.unproved:
            reasons = sorted(set(self.unproved))
            return (f"minimal within reach: {len(self.unproved)} simpler neighbour(s) proved nothing ("
                    + "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "") + ")")
        return "minimal"

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.key.check, "name": self.key.name, "subject": self.key.subject,
                "level": self.key.level.value, "category": self.key.category, "proof": self.proof,
                "unproved": list(self.unproved),
                "message": self.message, "minimal": self.minimal, "spec": self.spec.as_dict(),
                "case": self.spec.describe(), "first_failing_case": self.first_spec.describe(),
                "found_after_s": round(self.found_after_s, 2), "cases_before": self.cases_before,
                "shrink_steps": self.shrink_steps, "shrink_cases": self.shrink_tried,
                "shrink_s": round(self.shrink_s, 2), "path": self.path, "command": self.command}


@dataclass(frozen=True)
class Provenance:
    """Where a finding came from: the exploration's seed (None: not drawn), when, the implementation explored
    (its ``--coc-impl`` spec; "" for a case no implementation failed), and what it was kept from."""

    seed: int | None
    date: str
    implementation: str
    origin: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "date": self.date, "implementation": self.implementation, "from": self.origin}


def today() -> str:
    """The date a finding is written on (UTC, to the second)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def document(spec: Spec, provenance: Provenance, *, check: str = "", subject: str = "", level: str = "",
             category: str = "", message: str = "", minimal: bool = True, **run: Any) -> dict[str, Any]:
    """The file's content: what failed (nothing, for a kept boundary case), the case, where it came from, and what
    an exploration adds (``run``: only :data:`RUN_DETAILS`)."""
    unknown = set(run) - set(RUN_DETAILS)
    if unknown:
        raise TypeError(f"not part of a finding file: {sorted(unknown)}")
    return {"schema": SCHEMA, "check": check, "subject": subject, "level": level, "category": category,
            "case": spec.describe(), "spec": spec.as_dict(), "minimal": minimal, "message": message,
            "provenance": provenance.as_dict(), **run}


def write(path: Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` (a :func:`document`) to ``path``; the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def kept(doc: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """What a corpus keeps of a finding: all but how the exploration found it, ``from`` ``origin`` unless the
    finding already says where it came from."""
    provenance = dict(doc["provenance"])
    provenance["from"] = provenance.get("from") or origin
    return {**{k: v for k, v in doc.items() if k not in RUN_DETAILS}, "provenance": provenance}


def load_finding(path: Path) -> tuple[Spec, dict[str, Any]]:
    """The spec of a finding file and its document (of schema :data:`SCHEMA`: one of schema 2 read as one); a
    :class:`SpecError` naming the file when it is not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: not a spec file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") not in READS or "spec" not in doc:
        raise SpecError(f"{path}: not a spec of schema {' or '.join(map(str, READS))}")
    return spec_from_dict(doc["spec"]), _current(doc, Path(path))


def _current(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """``doc`` with every field of this schema: a schema 2 explorer finding kept its seed at the top and no
    provenance (its date is then the file's, its implementation unknown), a hand-written file may leave fields out."""
    provenance = doc.get("provenance") or Provenance(
        doc.get("seed"), datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat(timespec="seconds"),
        "", path.name).as_dict()
    defaults = {"check": "", "subject": "", "level": "", "category": "", "minimal": True, "message": ""}
    return {**defaults, **{k: v for k, v in doc.items() if k != "seed"}, "schema": SCHEMA, "provenance": provenance}


def write_finding(finding: Finding, directory: Path, *, implementation: str, command: Callable[[Path], str],
                  seed: int, budget_s: float) -> Path:
    """Save ``finding`` of an exploration of ``implementation`` from ``seed`` as a replayable file in ``directory``,
    with the command that replays it (``command`` of the file's path); its path."""
    path = directory / f"{finding.key.slug()}-{spec_key(finding.spec)}.json"
    finding.path, finding.command = str(path), command(path)
    details = finding.as_dict()
    return write(path, document(finding.spec, Provenance(seed, today(), implementation, "an exploration"),
                                check=finding.key.check, subject=finding.key.subject, level=finding.key.level.value,
                                category=finding.key.category, message=finding.message, minimal=finding.minimal,
                                budget_s=budget_s, **{k: details[k] for k in RUN_DETAILS if k in details}))
