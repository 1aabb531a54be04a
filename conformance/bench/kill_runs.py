"""The runs of the suite the smoke tier is chosen from (``python -m conformance.bench tiers``), kept in one file so
that a later choice runs only what changed.

* **Candidates**: every case of the suite's config, op, layer and training
  modules, collected with the TP it runs at and the op or layer kind it
  exercises (:func:`collect`).  Perf gates, the explorer and the corpus are
  not candidates (the corpus is in the tier whole).
* **The reference's run** of the candidates and the corpus, in one process:
  each case's cost (:func:`cost_of`) and the checks it records.
* **Each fault's run** of its module's candidates (``--coc-impl
  <faults>:<fault>``, with the proof table's options for that module): the
  record of every case it did not pass (its outcome and its checks that did
  not pass), which is all a proof row reads of a case.

A fault's records stay valid while its source does
(:func:`conformance.bench.fault_sources.source_digest`) and are kept for the
cases it ran: a new or changed fault runs its module again, and new cases
run, alone, against every fault of their module.  Changes to the
suite's own judging are not seen here: ``--rerun faults`` runs every fault
again (and the proof table's run of each row on its tier cases,
``tests/suite_runs``, fails on a kill that no longer holds).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

#: The checkout's root: faults and the proof table are the project's tests, run from a checkout.
ROOT = Path(__file__).resolve().parents[2]
#: Suite modules whose cases are candidates of the tier.
CANDIDATE_MODULES = ("test_config", "test_ops", "test_layers", "test_training")
#: The corpus: in the tier whole, run by the reference for its cost.
CORPUS_MODULE = "test_corpus"
#: Outcomes of a case the reference judged (a case it skips judges nothing here).
JUDGED = ("passed", "failed", "not-gated")
#: Cost samples of the reference kept per case (the cost is their median).
SAMPLES = 5
SCHEMA = 1
T = TypeVar("T")


@dataclass(frozen=True)
class Candidate:
    """A case the tier may hold."""

    id: str  #: the case id (``test_ops.py::test_x[params]``)
    tp: int  #: the largest TP size it runs at (0: in the test process)
    kind: str  #: the op or layer kind it exercises ("" for none)

    @property
    def module(self) -> str:
        return self.id.split(".py::", 1)[0]

    @property
    def test(self) -> str:
        """Its test function, as ``module::name``."""
        return self.id.split("[", 1)[0]


class _Collector:
    """A plugin recording the collected cases of the candidate modules."""

    def __init__(self) -> None:
        self.cases: list[Candidate] = []

    def pytest_collection_finish(self, session: Any) -> None:
        from conformance.caseids import capability, case_id, needs

        for item in session.items:
            need = needs(item)
            cid = case_id(item.nodeid)
            if cid.split(".py::", 1)[0] in (*CANDIDATE_MODULES, CORPUS_MODULE) and not need.exclusive:
                self.cases.append(Candidate(cid, max(need.tps, default=0), capability(item) or ""))


def collect() -> list[Candidate]:
    """The suite's candidate and corpus cases as collected here (``pytest --collect-only``, in this process)."""
    import pytest

    collector = _Collector()
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", "--rootdir",
                            str(ROOT), "-c", str(ROOT / "pyproject.toml"), "--pyargs", "conformance.suite"],
                           plugins=[collector])
    if code not in (0, 5) or not collector.cases:
        raise RuntimeError(f"collecting the suite failed (exit code {code}):\n{output.getvalue()[-3000:]}")
    return collector.cases


def cost_of(record: Mapping[str, Any]) -> float:
    """What a case costs a run, from its JSON summary record: the rank-seconds its lease held (its world times its
    rank time, pool starts left out) and its worker's time beside the ranks (set-up, checks); a case without
    ranks, its wall (:func:`conformance.bench.recorded_run.case_of` reads the timings)."""
    from conformance.bench.recorded_run import case_of

    case = case_of(record)
    return case.world * case.rank_s + case.worker_s


def _condensed(record: Mapping[str, Any]) -> dict[str, Any]:
    """A fault run's case record as kept: its outcome and its checks that did not pass (without their messages,
    which no row reads)."""
    from conformance.record.verdicts import PASSED, outcome_of

    checks = [{"name": c["name"], "level": c["level"], "outcome": outcome_of(c), "category": c.get("category", ""),
               "message": ""} for c in record.get("checks", ())]
    return {"outcome": record["outcome"], "checks": [c for c in checks if c["outcome"] != PASSED]}


def _read_records(summary: Path) -> list[dict[str, Any]]:
    """The case records of a run's summary (or, when its session died before writing it, of its lines file)."""
    if summary.is_file():
        return list(json.loads(summary.read_text())["cases"])
    lines = summary.with_name(summary.name + "l")
    if lines.is_file():
        return [json.loads(line) for line in lines.read_text().splitlines() if line.strip()]
    return []


def targets(cases: Sequence[str], modules: Mapping[str, Sequence[str]]) -> list[str]:
    """``--pyargs`` targets running ``cases``: a module where they are all of its cases (``modules``: module -> its
    case ids), else each case."""
    wanted = set(cases)
    whole = [m for m, ids in modules.items() if ids and set(ids) <= wanted]
    named = {c for m in whole for c in modules[m]}
    return [f"conformance.suite.{m}" for m in whole] + [
        f"conformance.suite.{c.replace('.py::', '::', 1)}" for c in cases if c not in named]


@dataclass(frozen=True)
class SuiteRuns:
    """How the command runs the suite: on one rank server (its fork server imports torch once for every run), with
    leases of its own (another session's cases never wait on these), each run in a fresh pytest process."""

    server: str
    lease_dir: str
    jobs: int = 1
    timeout_s: float = 3600.0

    def run(self, impl: str, targets: Sequence[str], options: Sequence[str] = ()) -> list[dict[str, Any]]:
        """The summary records of ``targets`` (:func:`targets`) run against ``impl``."""
        with tempfile.TemporaryDirectory(prefix="coc-tiers-") as tmp:
            summary = Path(tmp) / "coc-summary.json"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                             os.environ.get("PYTHONPATH")]))}
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q",
                       "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "--coc-impl", impl,
                       "--coc-summary", str(summary), "--coc-rank-server", self.server,
                       "--coc-lease-dir", self.lease_dir, *options, "--pyargs", *targets]
            done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True,
                                  timeout=self.timeout_s)
            records = _read_records(summary)
            if not records:
                raise RuntimeError(f"{impl}: the run recorded no case (exit code {done.returncode}):\n"
                                   f"{(done.stdout + done.stderr)[-3000:]}")
            return records

    def each(self, runs: Sequence[tuple[str, Sequence[str], Sequence[str]]],
             tags: Sequence[T]) -> Iterator[tuple[T, list[dict[str, Any]]]]:
        """:meth:`run` of each ``(impl, targets, options)``, :attr:`jobs` at a time: its tag and its records, in the
        order the runs end."""
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            pending = {pool.submit(self.run, *run): tag for run, tag in zip(runs, tags)}
            for done in as_completed(pending):
                yield pending[done], done.result()


class RunStore:
    """The kept runs (one JSON file): the reference's records and costs, each fault's records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        data = json.loads(path.read_text()) if path.is_file() else {}
        if data and data.get("schema") != SCHEMA:
            data = {}
        #: case id -> {"cost_s": [samples], "outcome": str, "checks": [[level, name], ...]}
        self.reference: dict[str, dict[str, Any]] = data.get("reference", {})
        #: "<module>:<fault>" -> {"digest": str, "missing": [case ids not run], "cases": {case id: record}}
        self.faults: dict[str, dict[str, Any]] = data.get("faults", {})
        #: module -> the candidate ids the fault entries' ``missing`` are relative to
        self.candidates: dict[str, list[str]] = data.get("candidates", {})

    def save(self) -> None:
        data = {"schema": SCHEMA, "about": "runs kept by `python -m conformance.bench tiers` (conformance/bench/"
                "kill_runs.py); a fault's records: its cases that did not pass",
                "candidates": {m: sorted(ids) for m, ids in sorted(self.candidates.items())},
                "reference": dict(sorted(self.reference.items())),
                "faults": {k: {"digest": v["digest"], "missing": sorted(v["missing"]),
                               "cases": dict(sorted(v["cases"].items()))} for k, v in sorted(self.faults.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(data, indent=None, separators=(",", ":"), sort_keys=False)
        # one line per case record, so a re-run's change reads as a diff
        text = text.replace(',"test_', ',\n"test_').replace('{"test_', '{\n"test_')
        self.path.write_text(text + "\n")

    # --- the reference -------------------------------------------------------------------------------------------
    def reference_needed(self, cases: Iterable[str], rerun: bool) -> list[str]:
        """Cases the reference must run (all of them with ``rerun``, else those without a record)."""
        return [c for c in cases if rerun or c not in self.reference]

    def keep_reference(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            kept = self.reference.get(record["id"], {})
            samples = [*kept.get("cost_s", []), round(cost_of(record), 4)][-SAMPLES:]
            names = sorted({(c["level"], c["name"]) for c in record.get("checks", ())})
            self.reference[record["id"]] = {"cost_s": samples, "outcome": record["outcome"],
                                            "checks": [list(n) for n in names]}

    def cost(self, case: str) -> float:
        return float(statistics.median(self.reference[case]["cost_s"]))

    # --- the faults ----------------------------------------------------------------------------------------------
    def align(self, module: str, ids: Sequence[str]) -> None:
        """Make ``ids`` the module's candidates: a new case is missing from every fault's run, a gone one forgotten."""
        old = set(self.candidates.get(module, ()))
        new, gone = set(ids) - old, old - set(ids)
        for key, entry in self.faults.items():
            if key.split(":", 1)[0] == module:
                entry["missing"] = sorted((set(entry["missing"]) - gone) | new)
                entry["cases"] = {c: r for c, r in entry["cases"].items() if c not in gone}
        self.candidates[module] = sorted(ids)

    def fault_needed(self, module: str, fault: str, digest: str, rerun: bool) -> list[str]:
        """The module's candidates ``fault`` must run on: all of them for a new, changed or re-run fault, else the
        cases it has not run."""
        entry = self.faults.get(f"{module}:{fault}")
        if rerun or entry is None or entry["digest"] != digest:
            return list(self.candidates[module])
        return list(entry["missing"])

    def keep_fault(self, module: str, fault: str, digest: str, ran: Sequence[str],
                   records: Iterable[Mapping[str, Any]]) -> None:
        key = f"{module}:{fault}"
        entry = self.faults.get(key)
        if entry is None or entry["digest"] != digest:
            entry = {"digest": digest, "missing": list(self.candidates[module]), "cases": {}}
        by_id = {r["id"]: _condensed(r) for r in records}
        for case in ran:
            entry["cases"].pop(case, None)
            record = by_id.get(case)
            if record is not None and (record["outcome"] != "passed" or record["checks"]):
                entry["cases"][case] = record
        entry["missing"] = sorted(set(entry["missing"]) - set(ran))
        self.faults[key] = entry

    def records(self, module: str, fault: str) -> dict[str, dict[str, Any]]:
        """Case id -> the fault's record of it, for every case it ran (a passed one where it passed, or where the
        run recorded nothing of it: deselected by the module's options, or lost with its session)."""
        entry = self.faults[f"{module}:{fault}"]
        ran = set(self.candidates[module]) - set(entry["missing"])
        return {case: {"id": case, **entry["cases"].get(case, {"outcome": "passed", "checks": []})}
                for case in sorted(ran)}
