"""``python -m conformance.matrix``: implementations x area x requirement level, as a markdown table.

Read runs already made (``--summary NAME=coc-summary.json``) or run the suite
for each implementation (``--run NAME=module:attr``, with ``--pytest-arg`` for
extra options such as ``-n 2`` or an expectations file).  ``--out`` writes the
table to a file; ``--alluredir`` adds it to an Allure results directory, so
the report shows it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from conformance.gating import matrix


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def run_suite(impl: str, summary: Path, extra: list[str]) -> int:
    command = [sys.executable, "-m", "pytest", "--pyargs", "conformance.suite", "--coc-impl", impl,
               "--coc-summary", str(summary), "-q", "-p", "no:cacheprovider", *extra]
    print("$", " ".join(command), file=sys.stderr)
    return subprocess.run(command).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.matrix", description=__doc__.split("\n\n")[0])
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
                print(f"conformance.matrix: the run of {impl} wrote no summary", file=sys.stderr)
                return 2
            runs[name] = json.loads(summary.read_text())["cases"]
    table = matrix.markdown(runs)
    print(table, end="")
    if args.out:
        args.out.write_text(table, encoding="utf-8")
    if args.alluredir:
        matrix.write_allure(table, args.alluredir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
