"""The conformance matrix: implementation x area x requirement level, as pass / known / fail counts.

Counts *checks* (a test holds one or more, each at a level): a failed check of
a case reported as known (expectations) or not gated counts as known.  A case
that failed without recording a check (a hang, a crash, an error before any
check) counts as one failed MUST check.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.judge.levels import Level

AREAS = ("config", "ops", "layers", "training", "perf")
OUTCOMES = ("pass", "known", "fail")


def tally(cases: Sequence[Mapping[str, Any]]) -> Counter[tuple[str, str, str]]:
    """``(area, level, pass|known|fail)`` -> number of checks."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for case in cases:
        known = case["outcome"] in ("known", "not-gated")
        checks = case.get("checks") or []
        if not checks and case["outcome"] in ("failed", "error"):
            counts[(case["area"], Level.MUST.value, "fail")] += 1
        for check in checks:
            status = "pass" if check["passed"] else "known" if known else "fail"
            counts[(case["area"], check["level"], status)] += 1
    return counts


def markdown(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """One row per implementation, one column per area and level: ``pass / known / fail``."""
    counts = {name: tally(cases) for name, cases in runs.items()}
    areas = [a for a in AREAS if any(k[0] == a for c in counts.values() for k in c)]
    areas += sorted({k[0] for c in counts.values() for k in c} - set(areas))
    columns = [(a, level.value) for a in areas for level in Level
               if any((a, level.value, o) in c for c in counts.values() for o in OUTCOMES)]
    lines = ["| implementation | " + " | ".join(f"{a} {lvl}" for a, lvl in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for name, c in counts.items():
        cells = [" / ".join(str(c[(a, lvl, o)]) for o in OUTCOMES) for a, lvl in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Each cell: checks passed / known (expected failures, or levels not gated) / failed.")
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
