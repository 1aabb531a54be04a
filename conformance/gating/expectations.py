"""The expectations file: known outcomes of an implementation, per case-id pattern.

TOML, in the manner of web-platform-tests' per-implementation metadata and
Chromium's TestExpectations::

    [meta]
    implementation = "conformance.adapters.mindspeed:MindSpeedCoC"

    [[expect]]
    pattern = "test_layers.py::test_uneven_tokens[*row*]"   # fnmatch on the case id
    outcome = "fail"                                         # fail | hang | skip
    reason  = "remainder rows are left unwritten when m % p != 0"
    link    = "https://example.org/issue/1"                  # optional

A case id is the pytest node id without directories
(``test_layers.py::test_x[params]``); in a pattern ``*`` and ``?`` are
wildcards and brackets are literal.  The first matching entry wins.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.caseids import matches

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

OUTCOMES = ("fail", "hang", "skip")


class ExpectationsError(ValueError):
    """The expectations file cannot be read or is malformed (the message names the entry)."""


@dataclass(frozen=True)
class Expectation:
    pattern: str
    outcome: str
    reason: str
    link: str = ""

    def describe(self) -> str:
        return self.reason + (f" ({self.link})" if self.link else "")


@dataclass(frozen=True)
class Expectations:
    entries: tuple[Expectation, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Expectations:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ExpectationsError(f"expectations file {path}: {exc}") from None
        return cls.parse(doc, where=str(path))

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
            extra = set(raw) - {"pattern", "outcome", "reason", "link"}
            if extra:
                raise ExpectationsError(f"{at}: unknown key(s) {sorted(extra)}")
            for key in ("pattern", "outcome", "reason"):
                if not isinstance(raw.get(key), str) or not raw[key]:
                    raise ExpectationsError(f"{at}: {key!r} must be a non-empty string")
            if raw["outcome"] not in OUTCOMES:
                raise ExpectationsError(f"{at}: outcome must be one of {OUTCOMES}, got {raw['outcome']!r}")
            entries.append(Expectation(raw["pattern"], raw["outcome"], raw["reason"], str(raw.get("link", ""))))
        return cls(tuple(entries), dict(doc.get("meta", {})))

    def match(self, case: str) -> Expectation | None:
        """The first entry whose pattern matches the case id."""
        for entry in self.entries:
            if matches(case, entry.pattern):
                return entry
        return None

    def dumps(self) -> str:
        lines = ["# Known outcomes of an implementation under the coc-conformance suite.",
                 "# Written by `coc-expectations`; edit reasons and links freely.", ""]
        if self.meta:
            lines.append("[meta]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in self.meta.items()]
            lines.append("")
        for entry in self.entries:
            lines += ["[[expect]]", f"pattern = {json.dumps(entry.pattern)}", f"outcome = {json.dumps(entry.outcome)}",
                      f"reason = {json.dumps(entry.reason)}"]
            if entry.link:
                lines.append(f"link = {json.dumps(entry.link)}")
            lines.append("")
        return "\n".join(lines)


def from_summary(cases: Iterable[Mapping[str, Any]], previous: Expectations | None = None,
                 meta: Mapping[str, Any] | None = None) -> Expectations:
    """Expectations matching a run: one exact entry per failed, hung or known case.

    Entries of ``previous`` that still match something that did not pass are
    kept as they are (with their reasons and links); exact entries for cases
    that now pass are dropped, so re-running the command after a fix empties
    the file of what was fixed.
    """
    previous = previous or Expectations(())
    kept: list[Expectation] = []
    covered: set[str] = set()
    results = {c["id"]: c for c in cases}
    for entry in previous.entries:
        hits = [cid for cid in results if matches(cid, entry.pattern)]
        still = [cid for cid in hits if results[cid]["outcome"] in ("failed", "error", "known")
                 or (entry.outcome == "skip" and results[cid]["outcome"] == "skipped")]
        if still or not hits:
            kept.append(entry)
            covered.update(still)
    for cid, case in sorted(results.items()):
        if cid in covered or case["outcome"] not in ("failed", "error"):
            continue
        failure = case.get("failure", {})
        outcome = "hang" if failure.get("category") == "hang" else "fail"
        message = (failure.get("message") or "").strip().splitlines()
        kept.append(Expectation(cid, outcome, (message[0] if message else "failed")[:300]))
    return Expectations(tuple(kept), dict(meta or previous.meta))


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
    meta = {"implementation": doc.get("implementation", "?")}
    updated = from_summary(doc.get("cases", []), previous, meta)
    args.out.write_text(updated.dumps(), encoding="utf-8")
    counts = {o: sum(e.outcome == o for e in updated.entries) for o in OUTCOMES}
    print(f"{args.out}: {len(updated.entries)} entries ({counts})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
