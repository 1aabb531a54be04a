"""Allure 3's quality gate, configured to match ``coc-gate``, and its result in the report's Quality Gates tab.

The rules: no failed or broken result (known failures are reported by the
suite as expected failures, which Allure counts as skipped), and -- when the
run's summary says how many cases it collected -- no fewer results than that
(a crashed worker's lost cases show).  ``allure quality-gate`` judges them;
``allure generate`` judges nothing, and its Quality Gates tab shows what the
state it restores holds (``allure run`` fills it), so the verdict travels to
it as a state dump (:func:`write_dump`, Allure's own ``--dump`` archive,
holding the gate's results and nothing else): each failed rule with Allure's
message, or, when the gate passed, each rule with what it found.
"""

from __future__ import annotations

import json
import re
import subprocess
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RULESET = "coc-conformance"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: A failed rule as ``allure quality-gate`` prints it: `` ⨯ <message>    <ruleset>/<rule>``.
_FAILED_RULE = re.compile(r"^\s*⨯\s+(?P<message>.*?)\s{2,}(?P<rule>\S+)\s*$")
#: The entries of a state dump that Allure 3.14 requires (``AllureStoreDumpFiles``); all empty but the gate's.
_DUMP_ENTRIES: dict[str, object] = {
    "test-results.json": {}, "test-cases.json": {}, "fixtures.json": {}, "attachments.json": {},
    "environments.json": [], "report-variables.json": {}, "global-attachments.json": [], "global-errors.json": [],
    "index-attachments-by-test-results.json": {}, "index-test-results-by-history-id.json": {},
    "index-test-results-by-test-case.json": {}, "index-attachments-by-fixture.json": {},
    "index-fixtures-by-test-result.json": {}, "index-known-by-history-id.json": {},
}


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict: passed or not, its rules, what ``allure quality-gate`` said, and each failed rule."""

    passed: bool
    rules: list[dict[str, object]]
    output: str
    failures: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "rules": self.rules, "output": self.output, "failures": self.failures}

    @property
    def summary(self) -> str:
        """``passed``, or ``FAILED`` and why (each failed rule's message)."""
        if self.passed:
            return "passed"
        why = "; ".join(f"{f['message']} ({f['rule']})" for f in self.failures)
        return f"FAILED: {why or (self.output.splitlines() or ['see the build log'])[-1][:200]}"


def rules(collected: int | None) -> list[dict[str, object]]:
    """No failure; and at least as many results as the suite collected, when its summary says so."""
    rule: dict[str, object] = {"id": RULESET, "maxFailures": 0}
    if collected:
        rule["minTestsCount"] = int(collected)
    return [rule]


def failed_rules(output: str) -> list[dict[str, str]]:
    """Each failed rule in ``allure quality-gate``'s output: ``{"rule", "message"}``."""
    found = (_FAILED_RULE.match(line) for line in _ANSI.sub("", output).splitlines())
    return [{"rule": m["rule"], "message": m["message"].strip()} for m in found if m]


def judge(executable: Path, results: Path, name: str, ruleset: list[dict[str, object]], env: Mapping[str, str],
          tmp: Path) -> GateResult:
    """Allure's quality gate on ``results``.  It reads a configuration of its own (rules only): given the
    report's, it would append the run to the history a second time."""
    gate_file = tmp / "qualitygate.json"
    gate_file.write_text(json.dumps({"name": name, "qualityGate": {"rules": ruleset}}))
    done = subprocess.run([str(executable), "quality-gate", str(results), "--config", str(gate_file)],
                          capture_output=True, text=True, env=dict(env), cwd=tmp)
    said = _ANSI.sub("", done.stdout + done.stderr).strip()
    return GateResult(done.returncode == 0, ruleset, said[-2000:], failed_rules(said))


def report_entries(gate: GateResult, stats: Mapping[str, int]) -> list[dict[str, Any]]:
    """The Quality Gates tab's entries: each failed rule (Allure's message), or each rule passed with what it
    found (``stats``: the results counted by status).  An unexplained failure is one entry with the output."""
    if not gate.passed:
        return [{"success": False, "rule": f["rule"], "message": f["message"]} for f in gate.failures] or \
            [{"success": False, "rule": RULESET, "message": gate.output or "the quality gate failed"}]
    found = {"maxFailures": stats.get("failed", 0) + stats.get("broken", 0), "minTestsCount": stats.get("total", 0)}
    said = {"maxFailures": "passed: {actual} failed or broken result(s), {expected} allowed",
            "minTestsCount": "passed: {actual} result(s), at least {expected} expected (the cases collected)"}
    return [{"success": True, "rule": f"{rule.get('id', RULESET)}/{key}", "expected": expected, "actual": found[key],
             "message": said[key].format(actual=found[key], expected=expected)}
            for rule in gate.rules for key, expected in rule.items() if key in said]


def write_dump(path: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    """An Allure state dump (``allure generate --dump``) that holds the quality gate's entries and nothing else."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, empty in _DUMP_ENTRIES.items():
            archive.writestr(name, json.dumps(empty))
        archive.writestr("quality-gate-results.json", json.dumps(list(entries)))
