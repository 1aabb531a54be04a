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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.judge.run_diff import PERF_THRESHOLD, RunDiff, RunError, diff_runs, load_run
from conformance.judge.verdicts import FAILED as CHECK_FAILED
from conformance.judge.verdicts import outcome_of


def _first_line(case: Mapping[str, Any]) -> str:
    message = str((case.get("failure") or {}).get("message", "")).strip()
    return (message.splitlines()[0] if message else "")[:200].replace("|", "\\|")


def _level(case: Mapping[str, Any]) -> str:
    failed = sorted({c["level"] for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED})
    return ", ".join(failed) or "-"


def markdown(result: RunDiff) -> str:
    """The PR comment."""
    verdict = "RED" if result.red else "GREEN"
    lines = [f"## coc-conformance gate: {verdict}", "",
             f"baseline `{result.baseline.source}` ({len(result.baseline.cases)} cases), current "
             f"`{result.current.source}` ({len(result.current.cases)} cases), implementation "
             f"`{result.current.implementation}`", ""]

    def table(title: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        lines.extend([f"### {title} ({len(rows)})", "", "| case | level | category | message |", "|---|---|---|---|"])
        for case in rows:
            category = (case.get("failure") or {}).get("category", "-")
            lines.append(f"| `{case['id']}` | {_level(case)} | {category} | {_first_line(case)} |")
        lines.append("")

    table("New failures", result.new_failures)
    if result.new_checks:
        lines.extend([f"### New failing checks in cases that already failed ({len(result.new_checks)})", "",
                      "| case | new failed checks |", "|---|---|"])
        for case, new in result.new_checks:
            checks = "; ".join(f"{name} ({level})" for name, level in new).replace("|", "\\|")
            lines.append(f"| `{case['id']}` | {checks} |")
        lines.append("")
    table("Hangs and crashes", result.hangs)
    table("Unexpected passes (update the expectations file)", result.unexpected_passes)
    regressions = result.perf_regressions
    if regressions:
        lines.extend([f"### Perf regressions ({len(regressions)})", "",
                      "| case | variant | baseline gain | current gain | change [90% CI] | verdict |",
                      "|---|---|---|---|---|---|"])
        for p in regressions:
            lines.append(f"| `{p.case}` | {p.variant} | {p.baseline:+.1%} | {p.current:+.1%} | {p.change:+.1%} "
                         f"[{p.interval[0]:+.1%}, {p.interval[1]:+.1%}] | {p.verdict} |")
        lines.append("")
    for title, names in (("Fixes", result.fixes), ("Newly skipped", result.new_skips),
                         ("No longer judged (not a fix)", result.no_longer_judged),
                         ("Missing from the current run", result.missing)):
        if names:
            lines.extend([f"### {title} ({len(names)})", ""] + [f"- `{n}`" for n in names[:50]])
            if len(names) > 50:
                lines.append(f"- ... and {len(names) - 50} more")
            lines.append("")
    if not (result.red or result.fixes or result.new_skips or result.no_longer_judged or result.missing
            or regressions):
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
