"""``coc-corpus``: from a finding to the corpus in one command.

``coc-corpus add reports/explore/*.json --to DIR`` copies each finding the
explorer wrote into a repository's corpus, unless the corpus already holds
one of the same kind, check and minimal spec, and records where it came from
(seed, date, implementation).  Every later run given ``--coc-corpus DIR``
replays it (:mod:`conformance.explore.corpus`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.explore.corpus import add_findings
from conformance.explore.spec import SpecError


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="coc-corpus", description=__doc__.split("\n\n")[0])
    commands = cli.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="copy new findings into a corpus directory")
    add.add_argument("findings", nargs="+", type=Path, help="spec files --coc-explore wrote")
    add.add_argument("--to", required=True, type=Path, metavar="DIR", help="the corpus directory")
    return cli


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        added = add_findings(args.findings, args.to)
    except SpecError as exc:
        print(f"coc-corpus: {exc}", file=sys.stderr)
        return 2
    for path in added.written:
        print(f"added {path}")
    for path in added.known:
        print(f"already held: {path}")
    print(f"{len(added.written)} added, {len(added.known)} already in {args.to}; replay them with "
          f"pytest --pyargs conformance.suite --coc-corpus {args.to}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
