"""``python -m conformance.gate --baseline DIR --current DIR``: did this change break anything?

Each ``DIR`` is a run's ``coc-summary.json`` (or the directory holding it, or
an Allure results directory).  Prints a markdown summary fit for a PR comment
(``--out`` writes it to a file too) and exits 1 when the current run has new
failures, hangs, unexpected passes or clear perf regressions
(:mod:`conformance.gating.compare`), 0 otherwise, 2 when a run cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.gating import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the last accepted run")
    parser.add_argument("--current", type=Path, required=True, help="the run of the change under review")
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    parser.add_argument("--perf-threshold", type=float, default=compare.PERF_THRESHOLD,
                        help="drop of the median paired gain counted as a perf regression (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        result = compare.compare(compare.load_run(args.baseline), compare.load_run(args.current),
                                 threshold=args.perf_threshold)
    except compare.RunError as exc:
        print(f"conformance.gate: {exc}", file=sys.stderr)
        return 2
    text = compare.markdown(result)
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if result.red else 0


if __name__ == "__main__":
    raise SystemExit(main())
