"""``coc-gate --baseline DIR --current DIR``: a run compared with a baseline run, for a CI gate and a PR comment.

The comparison, and what turns it red, is :mod:`conformance.record.run_diff`
(the report's baseline view shows the same sections): new failures, hangs,
unexpected passes, lost judgment (a case or a check the baseline judged that
the current run skipped, did not offer, did not judge or lost, unless the
current run's expectations file says so), clear perf regressions.  This
module renders its sections as markdown and sets the exit code.  "No change"
is said only when there is no section at all.  Either run's summary must be
complete (the suite marks it so when its session ends); without
``--baseline`` the command checks only that, for a CI job to run after the
suite (``coc-gate --current DIR``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.record.perf_changes import PERF_THRESHOLD
from conformance.record.run_diff import RunDiff, diff_runs
from conformance.record.runs import RunError, load_run

#: Rows shown per section (the rest counted).
ROWS_SHOWN = 50


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(result: RunDiff) -> str:
    """The PR comment: a verdict line, then every section of the comparison, in order."""
    verdict = "RED" if result.red else "GREEN"
    lines = [f"## coc-conformance gate: {verdict}", "",
             f"baseline `{result.baseline.source}` ({len(result.baseline.cases)} cases), current "
             f"`{result.current.source}` ({len(result.current.cases)} cases), implementation "
             f"`{result.current.implementation}`", ""]
    sections = result.sections
    for section in sections:
        lines.extend([f"### {section.title} ({len(section.rows)})", ""])
        if section.columns:
            lines.extend(["| case | " + " | ".join(section.columns) + " |", "|---|" + "---|" * len(section.columns)])
            lines.extend(f"| `{row.case}` | " + " | ".join(_cell(c) for c in row.cells) + " |"
                         for row in section.rows[:ROWS_SHOWN])
        else:
            lines.extend(f"- `{row.case}`" for row in section.rows[:ROWS_SHOWN])
        if len(section.rows) > ROWS_SHOWN:
            lines.append(f"... and {len(section.rows) - ROWS_SHOWN} more")
        lines.append("")
    if not sections:
        lines.append("No change in conformance or performance.")
    return "\n".join(lines).rstrip() + "\n"


DESCRIPTION = ("Compare a run with the last accepted one: exit 1 when it has new failures, hangs, unexpected "
               "passes, lost judgment its expectations do not name, or clear perf regressions; 2 when a run cannot "
               "be read or its summary is incomplete.  Without --baseline: exit 2 unless the run's summary is "
               "complete (a session that ended without one never passes a CI job).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coc-gate", description=DESCRIPTION)
    parser.add_argument("--baseline", type=Path, help="the last accepted run (none: only check that the current "
                                                        "run's summary is complete)")
    parser.add_argument("--current", type=Path, required=True, help="the run of the change under review")
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    parser.add_argument("--perf-threshold", type=float, default=PERF_THRESHOLD,
                        help="drop of the median paired gain counted as a perf regression (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        current = load_run(args.current)
        if args.baseline is None:
            print(f"coc-gate: {current.source}: a complete record of {len(current.cases)} case(s)")
            return 0
        result = diff_runs(load_run(args.baseline), current, threshold=args.perf_threshold)
    except RunError as exc:
        print(f"coc-gate: {exc}", file=sys.stderr)
        return 2
    text = markdown(result)
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if result.red else 0


if __name__ == "__main__":
    raise SystemExit(main())
