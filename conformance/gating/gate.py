"""``coc-gate --baseline DIR --current DIR``: a run compared with a baseline run, for a CI gate and a PR comment.

The comparison itself is :mod:`conformance.judge.run_diff` (the report's
baseline view makes the same one).  Red when the current
run has a new failure (a case that passed or did not exist in the baseline,
or a failed case with a failed check -- name and level, at a level the run
gates -- that the baseline's same case did not fail), a hang, an unexpected
pass, or a perf regression whose interval is clear of the threshold; fixes,
new skips, cases no longer judged (a failure or a pass that became ``not
judged`` is no fix) and missing cases are reported without turning it red.

Perf regressions compare the per-round *paired* gains of each CoC variant
(``(serial - coc) / serial``, measured back to back) of the two runs: a
bootstrap interval of the difference of their medians.  A drop larger than
the threshold is *clear* when the whole interval lies below minus the
threshold, else it is *within the noise* of the two runs -- reported, not
gating.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.judge.run_diff import PERF_THRESHOLD, RunDiff, RunError, diff_runs, load_run

#: Cases a list section names before "... and N more".
LISTED = 50


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(result: RunDiff) -> str:
    """The PR comment: every section of the comparison (:meth:`RunDiff.sections`), a table or a list of cases."""
    verdict = "RED" if result.red else "GREEN"
    lines = [f"## coc-conformance gate: {verdict}", "",
             f"baseline `{result.baseline.source}` ({len(result.baseline.cases)} cases), current "
             f"`{result.current.source}` ({len(result.current.cases)} cases), implementation "
             f"`{result.current.implementation}`", ""]
    sections = result.sections()
    for section in sections:
        lines.extend([f"### {section.title} ({len(section.rows)})", ""])
        if section.columns:
            lines.extend(["| case | " + " | ".join(section.columns) + " |", "|" + "---|" * (len(section.columns) + 1)])
            lines.extend(f"| `{row.case}` | " + " | ".join(map(_cell, row.cells)) + " |" for row in section.rows)
        else:
            lines.extend(f"- `{row.case}`" for row in section.rows[:LISTED])
            if len(section.rows) > LISTED:
                lines.append(f"- ... and {len(section.rows) - LISTED} more")
        lines.append("")
    if not sections:
        lines.append("No change in conformance or performance.")
    return "\n".join(lines).rstrip() + "\n"


DESCRIPTION = ("Compare a run with the last accepted one: exit 1 when it has new failures, hangs, "
               "unexpected passes or clear perf regressions, 2 when a run cannot be read.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coc-gate", description=DESCRIPTION)
    parser.add_argument("--baseline", type=Path, required=True, help="the last accepted run")
    parser.add_argument("--current", type=Path, required=True, help="the run of the change under review")
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    parser.add_argument("--perf-threshold", type=float, default=PERF_THRESHOLD,
                        help="drop of the median paired gain counted as a perf regression (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        result = diff_runs(load_run(args.baseline), load_run(args.current), threshold=args.perf_threshold)
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
