"""``coc-matrix``: implementation x area x requirement level, as pass / known / fail / not judged / not offered counts.

Reads runs already made (``--summary NAME=coc-summary.json``) or runs the suite
for each implementation (``--run NAME=module:attr``, ``--pytest-arg`` for extra
options); ``--out`` writes the table to a file, ``--alluredir`` adds it to an
Allure results directory so the report shows it.

Counts *checks* (a test holds one or more, each at a level): a failed check of
a case reported as known (expectations) or not gated counts as known; a check
with nothing to judge here counts as not judged, and one the implementation
does not offer (a case skipped because it lacks the op or raises
``NotImplementedError``) as not offered -- never as passed.  A case
that failed without recording a check (a hang, a crash, an error before any
check) counts as one failed MUST check; an error of the suite's own code counts for no implementation.
Each implementation's row starts with its verdict: an implementation whose
run judged nothing (no check passed, failed or known) is said so, never
shown as conformant.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance import options
from conformance.record.levels import Level
from conformance.record.verdicts import FAILED, NOT_JUDGED, NOT_OFFERED, PASSED, outcome_of

AREAS = ("config", "ops", "layers", "training", "perf")
PASS, KNOWN, FAIL = "pass", "known", "fail"
OUTCOMES = (PASS, KNOWN, FAIL, NOT_JUDGED, NOT_OFFERED)


def tally(cases: Sequence[Mapping[str, Any]]) -> Counter[tuple[str, str, str]]:
    """``(area, level, pass|known|fail|not judged|not offered)`` -> number of checks."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for case in cases:
        known = case["outcome"] in ("known", "not-gated")
        checks = case.get("checks") or []
        suite_bug = (case.get("failure") or {}).get("category") == "suite error"  # the suite's, not the impl's
        if not checks and case["outcome"] in ("failed", "error") and not suite_bug:
            counts[(case["area"], Level.MUST.value, FAIL)] += 1
        for check in checks:
            outcome = outcome_of(check)
            status = (PASS if outcome == PASSED else KNOWN if outcome == FAILED and known else FAIL
                      if outcome == FAILED else outcome)
            counts[(case["area"], check["level"], status)] += 1
    return counts


def verdict(counts: Counter[tuple[str, str, str]]) -> str:
    """An implementation's verdict from its counts: it fails, it judged nothing, it has known failures, it passes."""
    judged: Counter[str] = Counter()
    for (_, _, outcome), n in counts.items():
        judged[outcome] += n
    if judged[FAIL]:
        return f"fails {judged[FAIL]} check(s)"
    if not (judged[PASS] or judged[KNOWN]):
        return "judged nothing"
    return f"{judged[KNOWN]} known failure(s)" if judged[KNOWN] else "passes what it was judged on"


def markdown(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """One row per implementation: its verdict, then one column per area and level:
    ``pass / known / fail / not judged / not offered``."""
    counts = {name: tally(cases) for name, cases in runs.items()}
    areas = [a for a in AREAS if any(k[0] == a for c in counts.values() for k in c)]
    areas += sorted({k[0] for c in counts.values() for k in c} - set(areas))
    columns = [(a, level.value) for a in areas for level in Level
               if any((a, level.value, o) in c for c in counts.values() for o in OUTCOMES)]
    lines = ["| implementation | verdict | " + " | ".join(f"{a} {lvl}" for a, lvl in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for name, c in counts.items():
        cells = [verdict(c)] + [" / ".join(str(c[(a, lvl, o)]) for o in OUTCOMES) for a, lvl in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Each cell: checks passed / known (expected failures, or levels not gated) / failed / "
                 "not judged (nothing to judge here: a phase declared none, a perf gate not enforced here) / "
                 "not offered (the implementation lacks the op, or raises NotImplementedError for the mode).")
    return "\n".join(lines) + "\n"


def write_allure(matrix: str, results_dir: Path) -> Path:
    """Put the matrix into an Allure results directory, as a result of its own with the table attached."""
    results_dir.mkdir(parents=True, exist_ok=True)
    attachment = f"{uuid.uuid4()}-attachment.md"
    (results_dir / attachment).write_text(matrix, encoding="utf-8")
    now = int(time.time() * 1000)
    result = {
        "uuid": str(uuid.uuid4()), "name": "Conformance matrix", "fullName": "conformance.matrix",
        "historyId": "conformance-matrix", "status": "passed", "stage": "finished", "start": now, "stop": now,
        "labels": [{"name": "epic", "value": "CoC"}, {"name": "feature", "value": "matrix"}],
        "attachments": [{"name": "conformance matrix", "source": attachment, "type": "text/markdown"}],
    }
    path = results_dir / f"{result['uuid']}-result.json"
    path.write_text(json.dumps(result), encoding="utf-8")
    return path


DESCRIPTION = ("Implementations x area x requirement level: checks passed / known / failed / not judged / not "
               "offered, as a markdown table.")


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def run_suite(impl: str, summary: Path, extra: list[str]) -> int:
    command = [sys.executable, "-m", "pytest", "--pyargs", "conformance.suite", options.IMPL, impl,
               options.SUMMARY, str(summary), "-q", "-p", "no:cacheprovider", *extra]
    print("$", " ".join(command), file=sys.stderr)
    return subprocess.run(command).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coc-matrix", description=DESCRIPTION)
    parser.add_argument("--summary", type=_pair, action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--run", type=_pair, action="append", default=[], metavar="NAME=MODULE:ATTR")
    parser.add_argument("--pytest-arg", action="append", default=[], metavar="ARG",
                        help="extra pytest argument for --run (repeatable)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--alluredir", type=Path)
    args = parser.parse_args(argv)
    if not args.summary and not args.run:
        parser.error("give at least one --summary or --run")
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, path in args.summary:
        runs[name] = json.loads(Path(path).read_text())["cases"]
    with tempfile.TemporaryDirectory(prefix="coc-matrix-") as tmp:
        for name, impl in args.run:
            summary = Path(tmp) / f"{len(runs)}.json"
            run_suite(impl, summary, args.pytest_arg)
            if not summary.exists():
                print(f"coc-matrix: the run of {impl} wrote no summary", file=sys.stderr)
                return 2
            runs[name] = json.loads(summary.read_text())["cases"]
    table = markdown(runs)
    print(table, end="")
    if args.out:
        args.out.write_text(table, encoding="utf-8")
    if args.alluredir:
        write_allure(table, args.alluredir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
