"""The explorer's own proof: faults the fixed suite passes whole, each found by an exploration and shrunk.

Each row of :data:`EXPLORER_FAULTS` is a fault of ``tests/support/faulty_impls/``
in a corner no fixed case reaches, and the check its minimal case fails.
``python -m tests.support.explorer_faults [SECONDS] [SEED]`` explores each for
that long (default 300 s, seed 0), then replays every minimal case it wrote
with ``--coc-replay``, and prints per fault: the time to the first failure,
the cases explored before it, the minimal case, whether it is proved minimal,
and whether the replay fails the same check -- the figures the explorer is
held to, which are measured here rather than in a timed test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT


@dataclass(frozen=True)
class ExplorerFault:
    """A fault only the explorer finds, and the check its minimal case fails."""

    fault: str
    check: str


EXPLORER_FAULTS: tuple[ExplorerFault, ...] = (
    ExplorerFault("LongOddRowsTail", "numerics"),
    ExplorerFault("UnalignedKBias", "numerics"),
    ExplorerFault("ThirdCallOfAShape", "numerics"),
    ExplorerFault("WrongAtTp3", "numerics"),
    ExplorerFault("SlicedOddKReadsContiguous", "numerics"),
    ExplorerFault("ScatterOutputReusedByAllReduce", "results are values"),
    ExplorerFault("ClampsChunkCountBelowOne", "refused, naming the setting"),
    ExplorerFault("RowOutputSizedByFirstCall", "numerics"),
    ExplorerFault("ScaleCacheOfFourGroups", "w8A16 result matches the dequantised truth"),
)


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance.suite", "-p", "no:cacheprovider",
                           "-q", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)


def _failed_checks(summary: Path) -> list[str]:
    case = json.loads(summary.read_text())["cases"][0]
    return [c["name"] for c in case["checks"] if c["outcome"] == "failed"]


def explore(row: ExplorerFault, seconds: float, seed: int, work: Path) -> dict[str, object]:
    """Explore ``row``'s fault, replay what it found; the figures."""
    impl = f"tests.support.faulty_impls:{row.fault}"
    found, summary = work / row.fault, work / f"{row.fault}.json"
    _pytest("--coc-impl", impl, "--coc-explore", str(seconds), "--coc-seed", str(seed), "--coc-explore-dir",
            str(found), "--coc-summary", str(summary), "--coc-lease-dir", str(work / "leases"),
            "--coc-no-shipped-corpus")  # the draws' own figures: the shipped corpus holds each minimal case
    explored = json.loads(summary.read_text())["cases"][0]["explore"]
    figures: dict[str, object] = {"fault": row.fault, "cases": explored["cases"],
                                  "cases_per_s": explored["cases_per_s"], "findings": []}
    for finding in explored["findings"]:
        replayed = work / f"{row.fault}-replay.json"
        _pytest("--coc-impl", impl, "--coc-replay", finding["path"], "--coc-summary", str(replayed))
        figures["findings"].append({  # type: ignore[attr-defined]
            "check": finding["check"], "expected": finding["check"] == row.check,
            "first_failure_s": finding["found_after_s"], "cases_before": finding["cases_before"],
            "minimal_case": finding["case"], "minimal": finding["minimal"],
            "replay_fails_it": finding["name"] in _failed_checks(replayed), "spec": finding["path"]})
    return figures


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    seconds, seed = float(args[0]) if args else 300.0, int(args[1]) if len(args) > 1 else 0
    work = Path(tempfile.mkdtemp(prefix="explorer-faults-"))
    missed = 0
    for row in EXPLORER_FAULTS:
        figures = explore(row, seconds, seed, work)
        found = [f for f in figures["findings"] if f["expected"]]  # type: ignore[attr-defined]
        missed += not found
        print(f"{row.fault}: {figures['cases']} cases ({figures['cases_per_s']}/s)"
              + ("" if found else f"; NOT FOUND (expected {row.check!r})"))
        for f in figures["findings"]:  # type: ignore[attr-defined]
            print(f"    {f['check']!r} after {f['first_failure_s']} s, {f['cases_before']} case(s): "
                  f"{f['minimal_case']} ({'minimal' if f['minimal'] else 'not proved minimal'}; replay "
                  f"{'fails it' if f['replay_fails_it'] else 'PASSES'}) {f['spec']}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
