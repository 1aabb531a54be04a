"""Two runs of the suite compared case by case and check by check: what changed from a baseline.

The one comparison every consumer makes: ``coc-gate`` (a CI gate and a PR
comment) and the report's baseline view read the same :class:`RunDiff`, and
render the same ordered :attr:`RunDiff.sections`, each row saying whether it
turns the comparison red.  Reads either run's compact JSON summary
(``coc-summary.json``, written by the suite) or, failing that, an Allure
results directory.

Red when the current run has

* a new failure: a case that passed or did not exist in the baseline, or a
  failed case with a failed check -- name and level, at a level the run
  gates -- that the baseline's same case did not fail;
* a hang, or an unexpected pass;
* a *loss of judgment*: a case, or a check, that the baseline judged
  (passed or failed) and the current run did not -- skipped, not offered,
  not judged, stopped by an error of the suite's own, or missing.  A failure
  that became a skip is no fix, and neither is a pass that did.  A loss the
  current run's expectations file names (an ``unjudged`` entry, or a
  whole-case ``skip``) is listed as expected, without turning it red.  The
  checks of an exploration are a sample of what it drew: one it did not
  draw this time is not lost (its case still is, when it goes unjudged);
* a perf regression whose interval is clear of the threshold;
* a deterministic result whose bits changed, where both runs are of the same
  implementation code, device and torch (``digests``);
* a gate lowered from the baseline's (fewer levels fail the run);
* an expectations entry of a full run that matches no case, or names no check
  its cases recorded.

Fixes, perf drops within the noise, new failing checks at levels the run does
not gate, a raised gate and the stale entries of a partial run are listed
without turning it red.

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
from conformance.record.expected import SKIP, UNJUDGED, Expectation
from conformance.record.failures import HANG, SUITE_ERROR, UNEXPECTED_PASS
from conformance.record.intervals import CI_LEVEL, percentile_interval
from conformance.record.levels import Level
from conformance.record.verdicts import FAILED as CHECK_FAILED
from conformance.record.verdicts import JUDGED, NOT_JUDGED, NOT_OFFERED, outcome_of

#: Drop of the median paired gain (fraction of the serial time) that counts as a perf regression.
PERF_THRESHOLD = 0.03
FAILED = ("failed", "error")
#: What a case that is not in a run counts as.
MISSING = "missing"


class RunError(ValueError):
    """A results directory or summary that cannot be read."""


@dataclass(frozen=True)
class Run:
    """One run's cases, by case id, and where they came from."""

    source: str
    implementation: str
    cases: Mapping[str, Mapping[str, Any]]
    gate: frozenset[str] = frozenset(level.value for level in Level)  #: the levels whose failures failed a case
    #: The expectations file the run was judged against (its entries that say which losses are expected).
    expectations: tuple[Expectation, ...] = ()
    gate_spec: str = ""  #: ``--coc-gate`` as the run's summary states it ("": unknown, e.g. Allure results)
    #: Entries of its expectations file that matched no case, or named no check its cases recorded.
    stale_expectations: tuple[str, ...] = ()
    full_run: bool = False  #: whether it ran every case of the suite (then a stale entry is red)
    #: What its deterministic results depend on besides their case (the implementation's code, device, torch).
    determinism_environment: Mapping[str, Any] = field(default_factory=dict)


def load_run(path: Path) -> Run:
    """A run from a ``coc-summary.json`` (or a directory holding one) or an Allure results directory."""
    candidates = [path] if path.is_file() else [path / "coc-summary.json", path.parent / "coc-summary.json"]
    for candidate in candidates:
        if candidate.is_file():
            try:
                doc = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise RunError(f"{candidate}: {exc}") from None
            _require_complete(candidate, doc)
            cases = {c["id"]: c for c in doc.get("cases", [])}
            for nodeid in doc.get("missing", []):  # collected, never reported: its worker was lost
                cases.setdefault(case_id(nodeid), {"id": case_id(nodeid), "outcome": "error", "failure": {
                    "category": HANG, "type": WorkerLost.__name__, "message": f"{WorkerLost.__name__}: no result "
                    "(the worker running it died, or the run ended before it ran)"}})
            try:
                gated = frozenset(level.value for level in Level.parse_many(str(doc.get("gate") or "all")))
                expected = tuple(Expectation(**entry) for entry in doc.get("expectations", ()))
            except (TypeError, ValueError) as exc:
                raise RunError(f"{candidate}: gate or expectations: {exc}") from None
            return Run(str(candidate), doc.get("implementation", "?"), cases, gated, expected,
                       str(doc.get("gate") or ""), tuple(map(str, doc.get("stale_expectations", ()))),
                       bool(doc.get("full_run")), dict(doc.get("determinism_environment") or {}))
    if path.is_dir() and any(path.glob("*-result.json")):
        return _allure_run(path)
    raise RunError(f"{path}: neither a coc-summary.json nor an Allure results directory")


def _require_complete(path: Path, doc: Mapping[str, Any]) -> None:
    """Refuse a summary its run never finished writing (``complete: false``: killed, interrupted or still running),
    or one beside Allure results of another run: a verdict rests on a complete record of one run."""
    run = str(doc.get("run_id") or "?")
    if doc.get("complete") is False:
        raise RunError(f"{path}: the summary of run {run} is incomplete (the run was killed, interrupted or is still "
                       "running): no verdict rests on it")
    from conformance.record.report_properties import RUN_LABEL

    others: set[str] = set()
    for result in path.parent.glob("*-result.json"):
        try:
            labels = json.loads(result.read_text()).get("labels", ())
        except (OSError, json.JSONDecodeError):
            continue
        others.update(str(label.get("value")) for label in labels if label.get("name") == RUN_LABEL)
    others.discard(run)
    if doc.get("run_id") and others:
        raise RunError(f"{path}: the summary is of run {run}, the Allure results beside it of run(s) "
                       f"{', '.join(sorted(others))}: not one run")


def _allure_run(path: Path) -> Run:
    """Cases from Allure result files (status and message only; no levels, no perf figures), each named by the
    case id it carries (label ``coc_case``, as a summary names it), else by its full name and parameters."""
    from conformance.record.report_properties import CASE_LABEL

    status = {"passed": "passed", "failed": "failed", "broken": "failed", "skipped": "skipped"}
    cases: dict[str, dict[str, Any]] = {}
    for result in path.glob("*-result.json"):
        doc = json.loads(result.read_text())
        labelled = [str(label.get("value")) for label in doc.get("labels", ()) if label.get("name") == CASE_LABEL]
        params = ", ".join(f"{p['name']}={p['value']}" for p in doc.get("parameters", []))
        case = labelled[0] if labelled else f"{doc.get('fullName', doc.get('name', result.stem))}[{params}]"
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
        if outcome == "skipped":
            record["skip_reason"] = message
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
class Loss:
    """A judgment the baseline made that the current run did not: a whole case, or one check of it."""

    case: str
    check: str  #: the check's name ("" when the case had no check: it failed before recording one)
    level: str
    before: str  #: the baseline's outcome of the check (or of the case)
    after: str  #: the current one: skipped, not offered, not judged, error (the suite's), missing
    why: str  #: why the current run did not judge it (its skip reason, its message)
    expected: Expectation | None = None  #: the current run's expectations entry saying it may happen


@dataclass(frozen=True)
class Row:
    """One row of a section: the case it is about, one cell per column of the section, and whether it is red."""

    case: str
    cells: tuple[str, ...]
    red: bool
    #: Each check whose outcome changed: ``numerics (MUST): passed -> failed`` (empty when the baseline has none).
    changes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """One section of a comparison, as every renderer shows it: a title, its columns after the case, its rows."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]

    @property
    def red(self) -> bool:
        return any(row.red for row in self.rows)


@dataclass
class RunDiff:
    """What changed from the baseline run to the current one (:meth:`sections`: all of it, in order)."""

    baseline: Run
    current: Run
    new_failures: list[Mapping[str, Any]] = field(default_factory=list)
    #: Cases that failed in both runs, each with the failed checks (name, level) the baseline's did not fail.
    new_checks: list[tuple[Mapping[str, Any], list[tuple[str, str]]]] = field(default_factory=list)
    hangs: list[Mapping[str, Any]] = field(default_factory=list)
    unexpected_passes: list[Mapping[str, Any]] = field(default_factory=list)
    #: Judgments the baseline made and the current run did not (expected ones too: see :attr:`Loss.expected`).
    lost: list[Loss] = field(default_factory=list)
    #: Cases with failed checks (name, level) at levels the current run does not gate, not failed in the baseline.
    ungated: list[tuple[Mapping[str, Any], list[tuple[str, str]]]] = field(default_factory=list)
    #: Cases whose deterministic results changed bits, each with the results that did (:func:`changed_digests`).
    changed_bits: list[tuple[str, list[str]]] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    perf: list[PerfChange] = field(default_factory=list)

    @property
    def perf_regressions(self) -> list[PerfChange]:
        return [p for p in self.perf if p.regression]

    @property
    def sections(self) -> list[Section]:
        """Every change, in the order every renderer shows it (empty sections left out)."""
        def changes(cid: str) -> tuple[str, ...]:
            return check_changes(self.baseline.cases.get(cid), self.current.cases.get(cid, {}))

        def failures(title: str, cases: Sequence[Mapping[str, Any]]) -> Section:
            return Section(title, ("level", "category", "message"), tuple(
                Row(str(c["id"]), (failed_levels(c), str((c.get("failure") or {}).get("category", "-")),
                                   first_line(c)), True, changes(str(c["id"]))) for c in cases))

        def losses(title: str, rows: Sequence[Loss], red: bool) -> Section:
            return Section(title, ("check", "level", "baseline", "now", "why"), tuple(
                Row(loss.case, (loss.check or "(the whole case)", loss.level or "-", loss.before, loss.after,
                                loss.why if loss.expected is None else f"expected: {loss.expected.describe()}"),
                    red) for loss in rows))

        sections = [
            failures("New failures", self.new_failures),
            Section("New failing checks in cases that already failed", ("new failed checks",), tuple(
                Row(str(case["id"]), ("; ".join(f"{name} ({level})" for name, level in new),), True,
                    changes(str(case["id"]))) for case, new in self.new_checks)),
            failures("Hangs and crashes", self.hangs),
            Section("Deterministic results whose bits changed (same inputs, configuration, implementation code, "
                    "device and torch)", ("results",), tuple(Row(cid, ("; ".join(changed),), True, changes(cid))
                                                            for cid, changed in self.changed_bits)),
            failures("Unexpected passes (update the expectations file)", self.unexpected_passes),
            losses("Lost judgment (judged in the baseline, not now)", [x for x in self.lost if x.expected is None],
                   True),
            Section("Perf regressions", ("variant", "baseline gain", "current gain", "change [90% CI]", "verdict"),
                    tuple(Row(p.case, (p.variant, f"{p.baseline:+.1%}", f"{p.current:+.1%}",
                                       f"{p.change:+.1%} [{p.interval[0]:+.1%}, {p.interval[1]:+.1%}]", p.verdict),
                              p.clear) for p in self.perf_regressions)),
            losses("Lost judgment the expectations file expects", [x for x in self.lost if x.expected is not None],
                   False),
            Section("New failing checks at levels this run does not gate", ("new failed checks",), tuple(
                Row(str(case["id"]), ("; ".join(f"{name} ({level})" for name, level in new),), False,
                    changes(str(case["id"]))) for case, new in self.ungated)),
            self._gates(),
            Section("Stale expectations (entries matching no case or check of the run)", ("why",), tuple(
                Row(entry.split(": ", 1)[0], (entry.split(": ", 1)[-1],), self.current.full_run)
                for entry in self.current.stale_expectations)),
            Section("Fixes", (), tuple(Row(cid, (), False, changes(cid)) for cid in self.fixes)),
        ]
        return [section for section in sections if section.rows]

    def _gates(self) -> Section:
        """The levels each run gates, where they differ: red when the current run gates fewer (a failure at a level
        it dropped no longer fails it), listed when it gates more."""
        before, now = self.baseline.gate_spec, self.current.gate_spec
        if not before or not now or self.baseline.gate == self.current.gate:
            return Section("", (), ())
        dropped = sorted(self.baseline.gate - self.current.gate)
        why = (f"lowered: failures at {', '.join(dropped)} no longer fail the run" if dropped
               else "raised: more levels fail the run")
        return Section("The gate differs from the baseline's", ("baseline", "current", "why"),
                       (Row("--coc-gate", (before, now, why), bool(dropped)),))

    @property
    def red(self) -> bool:
        return any(section.red for section in self.sections)


def diff_runs(baseline: Run, current: Run, *, threshold: float = PERF_THRESHOLD, seed: int = 0) -> RunDiff:
    result = RunDiff(baseline, current)
    for cid, case in sorted(current.cases.items()):
        before = baseline.cases.get(cid, {}).get("outcome")
        outcome = case["outcome"]
        category = (case.get("failure") or {}).get("category")
        if outcome in FAILED and not (category == SUITE_ERROR and judged(baseline.cases.get(cid, {}))):
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
        ungated = frozenset(level.value for level in Level) - current.gate
        new_ungated = sorted(failed_checks(case, ungated) - failed_checks(baseline.cases.get(cid, {}), ungated))
        if new_ungated:
            result.ungated.append((case, new_ungated))
        if cid in baseline.cases and "perf" in case and "perf" in baseline.cases[cid]:
            result.perf.extend(_perf_changes(cid, baseline.cases[cid]["perf"], case["perf"], threshold, seed))
    for cid, case in sorted(baseline.cases.items()):
        result.lost.extend(lost_judgment(case, current.cases.get(cid), current.expectations))
    if baseline.determinism_environment and baseline.determinism_environment == current.determinism_environment:
        for cid, case in sorted(current.cases.items()):
            changed = changed_digests(baseline.cases.get(cid, {}), case)
            if changed:
                result.changed_bits.append((cid, changed))
    return result


def changed_digests(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The deterministic results of a case (``digests``) whose bits differ between two runs of one environment,
    each matched by everything it depends on of the case (op, TP, layout, tiling, inputs)."""
    def keyed(case: Mapping[str, Any]) -> dict[str, tuple[str, Mapping[str, Any]]]:
        return {json.dumps({k: v for k, v in d.items() if k != "digest"}, sort_keys=True): (str(d["digest"]), d)
                for d in case.get("digests", ())}

    old, new = keyed(before), keyed(now)
    return [f"{d['op']} tp{d['tp']} {d['problem'].get('dtype', '')} "
            + ("its own tiling" if d["tiling"] is None else f"tiling {d['tiling']}")
            for key, (digest, d) in new.items() if key in old and old[key][0] != digest]


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


def judged(case: Mapping[str, Any]) -> bool:
    """Whether a run judged ``case``: it passed or failed (known and not gated are failures), or hung -- not
    skipped, not judged, nor stopped by an error of the suite's own."""
    category = (case.get("failure") or {}).get("category")
    return case.get("outcome") in ("passed", "failed", "known", "not-gated") or \
        (case.get("outcome") == "error" and category != SUITE_ERROR)


def lost_judgment(before: Mapping[str, Any], now: Mapping[str, Any] | None,
                  expectations: Sequence[Expectation] = ()) -> list[Loss]:
    """What the baseline's ``before`` judged that the current run's record of the same case (``now``; None: not in
    the run) does not: every judged check when the whole case lost its judgment, else each judged check now
    unjudged or gone (but for a hang, where the checks after it never ran, and an exploration's sample)."""
    if not judged(before):
        return []
    checks = [c for c in before.get("checks", ()) if outcome_of(c) in JUDGED]
    if now is None or not judged(now):
        after, why = _unjudged(now)
        whole = checks or [{"name": "", "level": "", "outcome": before["outcome"]}]  # it failed before any check
        return [_loss(before, c, outcome_of(c), after, why, now, expectations) for c in whole]
    if (now.get("failure") or {}).get("category") == HANG:
        return []
    current = {c["name"]: c for c in now.get("checks", ())}
    sampled = "explore" in now  # an exploration records the checks of what it drew
    losses = []
    for check in checks:
        there = current.get(check["name"])
        if there is None and not sampled:
            losses.append(_loss(before, check, outcome_of(check), MISSING, "the case no longer records this check",
                                now, expectations))
        elif there is not None and outcome_of(there) not in JUDGED:
            losses.append(_loss(before, check, outcome_of(check), outcome_of(there), str(there.get("message", "")),
                                now, expectations))
    return losses


def _unjudged(now: Mapping[str, Any] | None) -> tuple[str, str]:
    """What an unjudged case came out as (``not offered`` when every check it carries says so), and why."""
    if now is None:
        return MISSING, "not in the current run"
    outcomes = {outcome_of(c) for c in now.get("checks", ())}
    after = NOT_OFFERED if outcomes == {NOT_OFFERED} else str(now["outcome"])
    why = now.get("skip_reason") or (now.get("failure") or {}).get("message") or \
        next((str(c.get("message", "")) for c in now.get("checks", ()) if outcome_of(c) in (NOT_JUDGED, NOT_OFFERED)),
             "")
    return after, _first(str(why))


def _loss(before: Mapping[str, Any], check: Mapping[str, Any], was: str, after: str, why: str,
          now: Mapping[str, Any] | None, expectations: Sequence[Expectation]) -> Loss:
    cid = str(before["id"])
    expected = next((e for e in expectations if e.matches(cid) and (
        (e.outcome == UNJUDGED and (e.whole_case or (check["name"] and e.covers(check))))
        or (e.outcome == SKIP and e.whole_case and now is not None and now["outcome"] == "skipped"))), None)
    return Loss(cid, str(check["name"]), str(check["level"]), was, after, _first(why), expected)


def failed_checks(case: Mapping[str, Any], levels: frozenset[str]) -> set[tuple[str, str]]:
    """The (name, level) of every check ``case`` failed at one of ``levels``."""
    return {(c["name"], c["level"]) for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED
            and c["level"] in levels}


def failed_levels(case: Mapping[str, Any]) -> str:
    """The levels of the checks ``case`` failed ("-" when it recorded none)."""
    return ", ".join(sorted({c["level"] for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED})) or "-"


def first_line(case: Mapping[str, Any]) -> str:
    """The first line of the failure message of ``case`` (at most 200 characters)."""
    return _first(str((case.get("failure") or {}).get("message", "")))


def _first(text: str) -> str:
    lines = text.strip().splitlines()
    return (lines[0] if lines else "")[:200]


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
    return percentile_interval(my - mx, level=level)
