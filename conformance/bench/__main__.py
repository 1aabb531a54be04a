"""``python -m conformance.bench {overhead,coc,bounds} [options]``."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = {
    "overhead": "conformance.bench.overhead",
    "coc": "conformance.bench.coc",
    "bounds": "conformance.bench.bounds",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench")
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    args, rest = parser.parse_known_args(argv)
    module = importlib.import_module(BENCHMARKS[args.benchmark])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
