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

Perf regressions are :mod:`conformance.record.perf_changes`; what counts as
a loss of judgment, :mod:`conformance.record.lost_judgment`; each run is read
by :mod:`conformance.record.runs`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.record.failures import HANG, SUITE_ERROR, UNEXPECTED_PASS
from conformance.record.levels import Level
from conformance.record.lost_judgment import Loss, first_line_of, judged, lost_judgment
from conformance.record.perf_changes import PERF_THRESHOLD, PerfChange, perf_changes
from conformance.record.runs import Run
from conformance.record.verdicts import FAILED as CHECK_FAILED
from conformance.record.verdicts import outcome_of

FAILED = ("failed", "error")


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
            result.perf.extend(perf_changes(cid, baseline.cases[cid]["perf"], case["perf"], threshold, seed))
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


def failed_checks(case: Mapping[str, Any], levels: frozenset[str]) -> set[tuple[str, str]]:
    """The (name, level) of every check ``case`` failed at one of ``levels``."""
    return {(c["name"], c["level"]) for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED
            and c["level"] in levels}


def failed_levels(case: Mapping[str, Any]) -> str:
    """The levels of the checks ``case`` failed ("-" when it recorded none)."""
    return ", ".join(sorted({c["level"] for c in case.get("checks", ()) if outcome_of(c) == CHECK_FAILED})) or "-"


def first_line(case: Mapping[str, Any]) -> str:
    """The first line of the failure message of ``case`` (at most 200 characters)."""
    return first_line_of(str((case.get("failure") or {}).get("message", "")))
