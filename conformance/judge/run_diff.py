"""Two runs of the suite compared case by case and check by check: what changed from a baseline.

The one comparison every consumer makes: ``coc-gate`` (a CI gate and a PR
comment) and the report's baseline view read the same :class:`RunDiff`.
Reads either run's compact JSON summary (``coc-summary.json``, written by the
suite) or, failing that, an Allure results directory.  Red when the current
run has a new failure (a case that passed or did not exist in the baseline,
or a failed case with a failed check -- name and level, at a level the run
gates -- that the baseline's same case did not fail), a hang, an unexpected
pass, or a perf regression whose interval is clear of the threshold.

Perf regressions compare the per-round *paired* gains of each CoC variant
(``(serial - coc) / serial``, measured back to back) of the two runs: a
bootstrap interval of the difference of their medians.  A drop larger than
the threshold is *clear* when the whole interval lies below minus the
threshold, else it is *within the noise* of the two runs -- reported, not
gating.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conformance.caseids import case_id
from conformance.harness.case_errors import HANGS, WorkerLost
from conformance.judge.levels import Level
from conformance.judge.perf import CI_LEVEL
from conformance.judge.verdicts import FAILED as CHECK_FAILED
from conformance.judge.verdicts import NOT_JUDGED, outcome_of

#: Drop of the median paired gain (fraction of the serial time) that counts as a perf regression.
PERF_THRESHOLD = 0.03
FAILED = ("failed", "error")
#: Failure categories the gate reads from either input (the suite writes them; Allure's messages name them).
HANG, UNEXPECTED_PASS = "hang", "unexpected pass"


class RunError(ValueError):
    """A results directory or summary that cannot be read."""


@dataclass(frozen=True)
class Run:
    """One run's cases, by case id, and where they came from."""

    source: str
    implementation: str
    cases: Mapping[str, Mapping[str, Any]]
    gate: frozenset[str] = frozenset(level.value for level in Level)  #: the levels whose failures failed a case


def load_run(path: Path) -> Run:
    """A run from a ``coc-summary.json`` (or a directory holding one) or an Allure results directory."""
    candidates = [path] if path.is_file() else [path / "coc-summary.json", path.parent / "coc-summary.json"]
    for candidate in candidates:
        if candidate.is_file():
            try:
                doc = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise RunError(f"{candidate}: {exc}") from None
            cases = {c["id"]: c for c in doc.get("cases", [])}
            for nodeid in doc.get("missing", []):  # collected, never reported: its worker was lost
                cases.setdefault(case_id(nodeid), {"id": case_id(nodeid), "outcome": "error", "failure": {
                    "category": HANG, "type": WorkerLost.__name__, "message": f"{WorkerLost.__name__}: no result "
                    "(the worker running it died, or the run ended before it ran)"}})
            try:
                gated = frozenset(level.value for level in Level.parse_many(str(doc.get("gate") or "all")))
            except ValueError as exc:
                raise RunError(f"{candidate}: gate: {exc}") from None
            return Run(str(candidate), doc.get("implementation", "?"), cases, gated)
    if path.is_dir() and any(path.glob("*-result.json")):
        return _allure_run(path)
    raise RunError(f"{path}: neither a coc-summary.json nor an Allure results directory")


def _allure_run(path: Path) -> Run:
    """Cases from Allure result files (status and message only; no levels, no perf figures)."""
    status = {"passed": "passed", "failed": "failed", "broken": "failed", "skipped": "skipped"}
    cases: dict[str, dict[str, Any]] = {}
    for result in path.glob("*-result.json"):
        doc = json.loads(result.read_text())
        params = ", ".join(f"{p['name']}={p['value']}" for p in doc.get("parameters", []))
        case = f"{doc.get('fullName', doc.get('name', result.stem))}[{params}]"
        details = doc.get("statusDetails", {}) or {}
        outcome = status.get(doc.get("status", ""), "failed")
        message = str(details.get("message", ""))
        if outcome == "skipped" and message.startswith("XFAIL"):
            outcome = "known"
        if outcome == "failed" and message.startswith(UNEXPECTED_PASS):
            category = UNEXPECTED_PASS
        elif outcome == "failed" and any(hang.__name__ in message for hang in HANGS):
            category = HANG
        else:
            category = "error"
        record = {"id": case, "outcome": outcome, "failure": {"message": message, "category": category}}
        cases[case] = record
    return Run(str(path), "?", cases)


@dataclass(frozen=True)
class PerfChange:
    case: str
    variant: str
    baseline: float
    current: float
    change: float
    interval: tuple[float, float]
    threshold: float = PERF_THRESHOLD

    @property
    def regression(self) -> bool:
        return self.change < -self.threshold

    @property
    def clear(self) -> bool:
        return self.interval[1] < -self.threshold

    @property
    def verdict(self) -> str:
        return "clear" if self.clear else "within the noise of the two runs"


@dataclass(frozen=True)
class Row:
    """One case of a :class:`Section`: its id, its cells, and what changed per check."""

    case: str
    cells: tuple[str, ...] = ()
    #: Each check whose outcome changed: ``numerics (MUST): passed -> failed`` (empty when the baseline has none).
    changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """One kind of change, its rows in order: what ``coc-gate``'s comment and the report's baseline view walk."""

    title: str
    #: The columns after the case; none: the section is a list of cases.
    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    #: Whether its rows turn the comparison red.
    red: bool = False


@dataclass
class RunDiff:
    """What changed from the baseline run to the current one (:meth:`sections`: all of it, in order)."""

    baseline: Run
    current: Run
    new_failures: list[Mapping[str, Any]] = field(default_factory=list)
    #: Cases that failed in both runs, each with the failed checks (name, level) the baseline's did not fail.
    new_checks: list[tuple[Mapping[str, Any], list[tuple[str, str]]]] = field(default_factory=list)
    no_longer_judged: list[str] = field(default_factory=list)
    hangs: list[Mapping[str, Any]] = field(default_factory=list)
    unexpected_passes: list[Mapping[str, Any]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    new_skips: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    perf: list[PerfChange] = field(default_factory=list)

    @property
    def perf_regressions(self) -> list[PerfChange]:
        return [p for p in self.perf if p.regression]

    @property
    def red(self) -> bool:
        return bool(self.new_failures or self.new_checks or self.hangs or self.unexpected_passes
                    or any(p.clear for p in self.perf_regressions))

    def sections(self) -> list[Section]:
        """Every change, red ones first, in the order a reviewer reads them; sections without rows left out."""
        def changes(cid: str) -> tuple[str, ...]:
            return check_changes(self.baseline.cases.get(cid), self.current.cases.get(cid, {}))

        def cases(title: str, rows: list[Mapping[str, Any]], red: bool) -> Section:
            return Section(title, ("level", "category", "message"), tuple(
                Row(case["id"], (failed_levels(case), str((case.get("failure") or {}).get("category", "-")),
                                 first_line(case)), changes(case["id"])) for case in rows), red)

        def names(title: str, ids: list[str]) -> Section:
            return Section(title, (), tuple(Row(cid, (), changes(cid)) for cid in ids))

        perf = self.perf_regressions
        found = [
            cases("New failures", self.new_failures, True),
            Section("New failing checks in cases that already failed", ("new failed checks",), tuple(
                Row(case["id"], ("; ".join(f"{name} ({level})" for name, level in new),), changes(case["id"]))
                for case, new in self.new_checks), True),
            cases("Hangs and crashes", self.hangs, True),
            cases("Unexpected passes (update the expectations file)", self.unexpected_passes, True),
            Section("Perf regressions", ("variant", "baseline gain", "current gain", "change [90% CI]", "verdict"),
                    tuple(Row(p.case, (p.variant, f"{p.baseline:+.1%}", f"{p.current:+.1%}",
                                       f"{p.change:+.1%} [{p.interval[0]:+.1%}, {p.interval[1]:+.1%}]", p.verdict))
                          for p in perf), any(p.clear for p in perf)),
            names("Fixes", self.fixes),
            names("Newly skipped", self.new_skips),
            names("No longer judged (not a fix)", self.no_longer_judged),
            names("Missing from the current run", self.missing),
        ]
        return [section for section in found if section.rows]


def diff_runs(baseline: Run, current: Run, *, threshold: float = PERF_THRESHOLD, seed: int = 0) -> RunDiff:
    result = RunDiff(baseline, current)
    for cid, case in sorted(current.cases.items()):
        before = baseline.cases.get(cid, {}).get("outcome")
        outcome = case["outcome"]
        category = (case.get("failure") or {}).get("category")
        if outcome in FAILED:
            if category == UNEXPECTED_PASS:
                result.unexpected_passes.append(case)
            elif category == HANG:
                result.hangs.append(case)
            elif before not in FAILED:
                result.new_failures.append(case)
            else:
                new = sorted(failed_checks(case, current.gate) - failed_checks(baseline.cases[cid], current.gate))
                if new:
                    result.new_checks.append((case, new))
        elif outcome == "passed" and before in FAILED:
            result.fixes.append(cid)
        elif outcome == NOT_JUDGED and before in (*FAILED, "passed"):
            result.no_longer_judged.append(cid)
        elif outcome == "skipped" and before == "passed":
            result.new_skips.append(cid)
        if "perf" in case and "perf" in baseline.cases.get(cid, {}):
            result.perf.extend(_perf_changes(cid, baseline.cases[cid]["perf"], case["perf"], threshold, seed))
    result.missing = sorted(set(baseline.cases) - set(current.cases))
    return result


def first_line(case: Mapping[str, Any]) -> str:
    """The first line of a case's failure message (200 characters at most)."""
    message = str((case.get("failure") or {}).get("message", "")).strip()
    return (message.splitlines()[0] if message else "")[:200]


def failed_levels(case: Mapping[str, Any]) -> str:
    """The levels of the checks ``case`` failed, ``-`` for none."""
    return ", ".join(sorted({c["level"] for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED})) or "-"


def check_changes(before: Mapping[str, Any] | None, now: Mapping[str, Any]) -> tuple[str, ...]:
    """Each check whose outcome differs between a case's baseline and current records, ``name (LEVEL): a -> b``;
    of a case the baseline did not run, its failed checks.  Nothing when the baseline has no checks (Allure
    results, a report's history)."""
    if before is None:
        return tuple(f"{c['name']} ({c['level']}): {CHECK_FAILED}" for c in now.get("checks", ())
                     if outcome_of(c) == CHECK_FAILED)
    if "checks" not in before:
        return ()
    old = {(c["name"], c["level"]): outcome_of(c) for c in before["checks"]}
    new = {(c["name"], c["level"]): outcome_of(c) for c in now.get("checks", ())}
    absent = "not recorded"
    changed = sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))
    return tuple(f"{name} ({level}): {old.get((name, level), absent)} -> {new.get((name, level), absent)}"
                 for name, level in changed)


def failed_checks(case: Mapping[str, Any], levels: frozenset[str]) -> set[tuple[str, str]]:
    """The (name, level) of every check ``case`` failed at one of ``levels``."""
    return {(c["name"], c["level"]) for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED
            and c["level"] in levels}


def _perf_changes(cid: str, before: Mapping[str, Any], now: Mapping[str, Any], threshold: float,
                  seed: int) -> list[PerfChange]:
    changes = []
    for variant, figures in now.get("variants", {}).items():
        old = before.get("variants", {}).get(variant)
        a, b = (old or {}).get("paired_gains"), figures.get("paired_gains")
        if not a or not b:
            continue
        low, high = difference_ci(a, b, seed=seed)
        changes.append(PerfChange(cid, variant, float(np.median(a)), float(np.median(b)),
                                  float(np.median(b) - np.median(a)), (low, high), threshold))
    return changes


def difference_ci(before: Sequence[float], after: Sequence[float], *, level: float = CI_LEVEL,
                  resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``median(after) - median(before)`` (independent samples)."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    mx = np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)
    my = np.median(y[rng.integers(0, y.size, size=(resamples, y.size))], axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(my - mx, [tail, 100 - tail])
    return float(low), float(high)
