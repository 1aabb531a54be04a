"""``python -m conformance.bench {overhead,coc,bounds,hangs,device,schedule,tiers} [options]``."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = {
    "overhead": "conformance.bench.overhead",
    "coc": "conformance.bench.coc",
    "bounds": "conformance.bench.bounds",
    "hangs": "conformance.bench.hangs",
    "device": "conformance.bench.device",
    "schedule": "conformance.bench.schedule",
    "tiers": "conformance.bench.tier_choice",
}


def main(argv: list[str] | None = None) -> int:
    # No help of its own: ``-h`` after a benchmark's name is that benchmark's.
    parser = argparse.ArgumentParser(prog="python -m conformance.bench", add_help=False)
    parser.add_argument("benchmark", nargs="?", choices=sorted(BENCHMARKS))
    args, rest = parser.parse_known_args(argv)
    if args.benchmark is None:
        parser.print_usage()
        print("benchmarks: " + ", ".join(sorted(BENCHMARKS)) + "; `python -m conformance.bench NAME -h` for each")
        return 0 if {"-h", "--help"} & set(rest) else 2
    module = importlib.import_module(BENCHMARKS[args.benchmark])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
