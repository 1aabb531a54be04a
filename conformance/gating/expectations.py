"""The expectations file: known outcomes of an implementation, per case-id pattern and per check.

TOML, in the manner of web-platform-tests' per-implementation metadata and
Chromium's TestExpectations::

    [meta]
    implementation = "conformance.adapters.mindspeed:MindSpeedCoC"

    [[expect]]
    pattern = "test_layers.py::test_uneven_token_counts[*row*]"   # fnmatch on the case id
    check   = "m=7 *: numerics"                                     # optional: fnmatch on the check name
    level   = "MUST"                                                # optional: the check's level
    outcome = "fail"                                                # fail | hang | skip | unjudged
    reason  = "remainder rows are left unwritten when m % p != 0"
    link    = "https://example.org/issue/1"                         # optional

A case id is the pytest node id without directories
(``test_layers.py::test_x[params]``); in a pattern ``*`` and ``?`` are
wildcards and brackets are literal.

An entry with ``check`` or ``level`` knows the failure of the checks it names
and nothing else: another check failing in the same case is a new failure.
Prefer them (``coc-expectations`` writes them).  An entry with neither covers
the whole case, whatever fails in it (and ``skip`` is only for whole cases).
Of the whole-case entries the first matching one wins.

``unjudged`` says nothing of how a case runs: it tells ``coc-gate`` (and the
report's baseline view) that the cases or checks it names may lose their
judgment -- come out skipped, not offered, not judged, or go missing after
being judged in the baseline -- without that being a change
(``docs/DESIGN.md#gating-in-ci``).  A whole-case ``skip`` says the same of
its cases.  Every other loss of judgment turns the gate red.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conformance.record.expected import FAIL, FAILING, HANG, OUTCOMES, SKIP, UNJUDGED, Expectation
from conformance.record.levels import Level
from conformance.record.verdicts import FAILED, PASSED, outcome_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

class ExpectationsError(ValueError):
    """The expectations file cannot be read or is malformed (the message names the entry)."""


@dataclass(frozen=True)
class CaseVerdict:
    """What the check-level entries of one case make of its failed and passed checks."""

    known: list[tuple[Mapping[str, Any], Expectation]]  #: failed checks an entry expected, and that entry
    new: list[Mapping[str, Any]]  #: failed checks no entry expected (or expected another way: hang / fail)
    unexpected_passes: list[tuple[Mapping[str, Any], Expectation]]  #: entries whose checks all passed


def judge_checks(entries: Sequence[Expectation], checks: Sequence[Mapping[str, Any]], *, hung: bool) -> CaseVerdict:
    """Each failed check known or new, each entry met or passed unexpectedly (check-level entries only)."""
    known, new = [], []
    for check in checks:
        if outcome_of(check) != FAILED:
            continue
        entry = next((e for e in entries if e.outcome in FAILING and e.covers(check)), None)
        if entry is None or (entry.outcome == HANG) != hung:
            new.append(check)
        else:
            known.append((check, entry))
    met = {id(entry) for _, entry in known}
    unexpected = []
    for entry in entries:
        if id(entry) in met or entry.outcome not in FAILING:
            continue
        passed = [c for c in checks if entry.covers(c) and outcome_of(c) == PASSED]
        if passed:
            unexpected.append((passed[0], entry))
    return CaseVerdict(known, new, unexpected)


@dataclass(frozen=True)
class Expectations:
    entries: tuple[Expectation, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Expectations:
        try:
            text = path.read_text(encoding="utf-8")
            doc = tomllib.loads(text)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ExpectationsError(f"expectations file {path}: {exc}") from None
        parsed = cls.parse(doc, where=str(path))
        heads = [n for n, line in enumerate(text.splitlines(), 1) if line.strip() == "[[expect]]"]
        if len(heads) != len(parsed.entries):  # entries written as an inline array: no line each
            return parsed
        where = path.resolve()
        return cls(tuple(replace(entry, source=f"{where}:{line}") for entry, line in zip(parsed.entries, heads,
                                                                                         strict=True)), parsed.meta)

    @classmethod
    def parse(cls, doc: Mapping[str, Any], where: str = "expectations") -> Expectations:
        unknown = set(doc) - {"meta", "expect"}
        if unknown:
            raise ExpectationsError(f"{where}: unknown section(s) {sorted(unknown)}; expected [meta] and [[expect]]")
        entries = []
        for i, raw in enumerate(doc.get("expect", [])):
            at = f"{where}: [[expect]] #{i + 1}"
            if not isinstance(raw, Mapping):
                raise ExpectationsError(f"{at} must be a table")
            extra = set(raw) - {"pattern", "outcome", "reason", "link", "check", "level"}
            if extra:
                raise ExpectationsError(f"{at}: unknown key(s) {sorted(extra)}")
            for key in ("pattern", "outcome", "reason"):
                if not isinstance(raw.get(key), str) or not raw[key]:
                    raise ExpectationsError(f"{at}: {key!r} must be a non-empty string")
            if raw["outcome"] not in OUTCOMES:
                raise ExpectationsError(f"{at}: outcome must be one of {OUTCOMES}, got {raw['outcome']!r}")
            for key in ("check", "level", "link"):
                if not isinstance(raw.get(key, ""), str):
                    raise ExpectationsError(f"{at}: {key!r} must be a string")
            level = raw.get("level", "").upper()
            if level and level not in {lvl.value for lvl in Level}:
                raise ExpectationsError(f"{at}: level must be one of {[lvl.value for lvl in Level]}, "
                                        f"got {raw['level']!r}")
            entry = Expectation(raw["pattern"], raw["outcome"], raw["reason"], raw.get("link", ""),
                                raw.get("check", ""), level)
            if entry.outcome == SKIP and not entry.whole_case:
                raise ExpectationsError(f"{at}: 'skip' is for whole cases; a check cannot be skipped alone")
            entries.append(entry)
        return cls(tuple(entries), dict(doc.get("meta", {})))

    def match(self, case: str) -> Expectation | None:
        """The first whole-case entry whose pattern matches the case id (of how it runs: not ``unjudged``)."""
        return next((entry for entry in self.matching(case) if entry.whole_case), None)

    def matching(self, case: str) -> list[Expectation]:
        """Every entry saying how the case runs (fail, hang, skip) whose pattern matches its id, in file order."""
        return [entry for entry in self.entries if entry.outcome != UNJUDGED and entry.matches(case)]

    def dumps(self) -> str:
        lines = ["# Known outcomes of an implementation under the coc-conformance suite.",
                 "# Written by `coc-expectations`; edit reasons and links freely.", ""]
        if self.meta:
            lines.append("[meta]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in self.meta.items()]
            lines.append("")
        for entry in self.entries:
            lines += ["[[expect]]", f"pattern = {json.dumps(entry.pattern)}"]
            lines += [f"{key} = {json.dumps(value)}" for key, value in (("check", entry.check), ("level", entry.level))
                      if value]
            lines += [f"outcome = {json.dumps(entry.outcome)}", f"reason = {json.dumps(entry.reason)}"]
            if entry.link:
                lines.append(f"link = {json.dumps(entry.link)}")
            lines.append("")
        return "\n".join(lines)


def from_summary(cases: Iterable[Mapping[str, Any]], previous: Expectations | None = None,
                 meta: Mapping[str, Any] | None = None) -> Expectations:
    """Expectations matching a run: one exact entry per failed check (per case when it recorded none).

    Entries of ``previous`` that still match something that did not pass are
    kept as they are (with their reasons and links); exact entries for checks
    or cases that now pass are dropped, so re-running the command after a fix
    empties the file of what was fixed.
    """
    previous = previous or Expectations(())
    kept: list[Expectation] = []
    covered: set[tuple[str, str]] = set()  # (case id, check name; "" for a whole case)
    results = {c["id"]: c for c in cases}
    for entry in previous.entries:
        if entry.outcome == UNJUDGED:  # what a run may lose: nothing a run shows makes it stale
            kept.append(entry)
            continue
        hits = [cid for cid in results if entry.matches(cid)]
        still = _still_failing(entry, [results[cid] for cid in hits])
        if still or not hits:
            kept.append(entry)
            covered.update(still)
    for cid, case in sorted(results.items()):
        if (cid, "") in covered or case["outcome"] not in ("failed", "error"):
            continue
        failure = case.get("failure") or {}
        outcome = HANG if failure.get("category") == "hang" else FAIL
        failed = [c for c in case.get("checks", ()) if outcome_of(c) == FAILED]
        if not failed or outcome == HANG:
            kept.append(Expectation(cid, outcome, _first_line(failure.get("message"), "failed")))
            continue
        for check in failed:
            if (cid, check["name"]) not in covered:
                kept.append(Expectation(cid, outcome, _first_line(check.get("message"), "failed"),
                                        check=_literal(check["name"]), level=check["level"]))
    return Expectations(tuple(kept), dict(meta or previous.meta))


def _still_failing(entry: Expectation, hits: Sequence[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(case id, check name) of what ``entry`` still covers in the run's matching cases."""
    still: set[tuple[str, str]] = set()
    for case in hits:
        if entry.outcome == SKIP:
            if case["outcome"] == "skipped":
                still.add((case["id"], ""))
            continue
        if entry.whole_case:
            if case["outcome"] in ("failed", "error", "known"):
                still.add((case["id"], ""))
            continue
        still.update((case["id"], c["name"]) for c in case.get("checks", ())
                     if entry.covers(c) and outcome_of(c) == FAILED)
    return still


def _literal(name: str) -> str:
    """An fnmatch pattern matching exactly ``name`` (brackets and wildcards escaped)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


def _first_line(message: Any, default: str) -> str:
    lines = str(message or "").strip().splitlines()
    return (lines[0] if lines else default)[:300]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="coc-expectations",
        description="Write or update an expectations file from a run's JSON summary (coc-summary.json).")
    parser.add_argument("--summary", type=Path, required=True, help="the run's coc-summary.json")
    parser.add_argument("--out", type=Path, required=True, help="expectations file to write (updated if it exists)")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(args.summary.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read {args.summary}: {exc}", file=sys.stderr)
        return 2
    previous = Expectations.load(args.out) if args.out.exists() else None
    meta = {**(previous.meta if previous else {}), "implementation": doc.get("implementation", "?")}
    updated = from_summary(doc.get("cases", []), previous, meta)
    args.out.write_text(updated.dumps(), encoding="utf-8")
    counts = {o: sum(e.outcome == o for e in updated.entries) for o in OUTCOMES}
    print(f"{args.out}: {len(updated.entries)} entries ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
