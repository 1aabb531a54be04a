"""The corpus without ranks: the shipped directory, reading, de-duplicating, provenance, corpus-aware drawing."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance.explore.config_settings import ConfigSpec
from conformance.explore.corpus import SHIPPED, add_findings, read_corpus, read_entry
from conformance.explore.corpus_cli import main as coc_corpus
from conformance.explore.explorer import Explorer
from conformance.explore.finding import SCHEMA, Provenance, document, kept, load_finding, today, write
from conformance.explore.kind import Judged, Scope
from conformance.explore.op_spec import Call, OpSpec
from conformance.explore.spec import SpecError
from conformance.harness.runner import CaseTimings
from conformance.protocol import declarations
from tests.support.explorer_faults import EXPLORER_FAULTS
from tests.support.shipped_corpus import BOUNDARIES, FAULT_CASES, documents


def _finding(directory: Path, spec: Any, check: str, seed: int = 7, impl: str = "pkg.mod:Impl") -> Path:
    """A finding file as the explorer writes one (how it found it included)."""
    path = directory / f"{check.replace(' ', '-')}-{len(list(directory.iterdir())) if directory.is_dir() else 0}.json"
    return write(path, document(spec, Provenance(seed, today(), impl, "an exploration"), check=check, level="MUST",
                                category="x", path=str(path), command=f"pytest --coc-replay {path}", shrink_steps=2))


def test_the_shipped_corpus_is_what_the_table_says_and_every_file_reads() -> None:
    entries = read_corpus([SHIPPED])
    assert sorted(json.dumps(e.spec.as_dict(), sort_keys=True) for e in entries) == \
        sorted(json.dumps(d["spec"], sort_keys=True) for d in documents())
    assert len({e.case_id for e in entries}) == len(entries)


def test_the_shipped_corpus_holds_every_explorer_only_fault_and_every_chunk_count_boundary() -> None:
    assert set(FAULT_CASES) == {row.fault for row in EXPLORER_FAULTS}
    held = {e.spec for e in read_corpus([SHIPPED])}
    assert set(FAULT_CASES.values()) <= held
    chunks = {s.chunks for s in held if isinstance(s, ConfigSpec)}
    assert {"0", "-1", "1", "8", "9", "16"} <= chunks, chunks
    assert {s for s, _ in BOUNDARIES} <= held


def test_a_spec_read_twice_is_one_case_and_a_malformed_one_names_its_file(tmp_path: Path) -> None:
    spec = OpSpec((Call(3, 2, 1),), tp=1)
    _finding(tmp_path / "a", spec, "numerics")
    _finding(tmp_path / "b", spec, "numerics")
    assert len(read_corpus([tmp_path / "a", tmp_path / "b"])) == 1
    bad = tmp_path / "b" / "bad.json"
    bad.write_text(json.dumps({"schema": SCHEMA, "spec": {"kind": "op", "tp": 2}}))
    with pytest.raises(SpecError, match=str(bad)):
        read_corpus([tmp_path / "b"])
    with pytest.raises(SpecError, match="no such corpus directory"):
        read_corpus([tmp_path / "none"])


def test_add_keeps_one_entry_per_kind_check_and_spec_with_its_provenance(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    spec, other = OpSpec((Call(3, 2, 1),), tp=1), ConfigSpec(chunks="0")
    found = [_finding(tmp_path / "found", spec, "numerics"), _finding(tmp_path / "found", spec, "numerics"),
             _finding(tmp_path / "found", spec, "results are values"), _finding(tmp_path / "found", other, "x")]
    corpus = tmp_path / "corpus"
    added = add_findings(found, corpus)
    assert len(added.written) == 3 and added.known == (found[1],)
    entry = read_entry(added.written[0])
    assert entry.spec == spec and entry.doc["check"] == "numerics"
    assert entry.doc["provenance"]["seed"] == 7 and entry.doc["provenance"]["implementation"] == "pkg.mod:Impl"
    assert entry.doc["provenance"]["date"][:2] == "20" and entry.doc["provenance"]["from"] == "an exploration"
    assert not {"path", "command", "shrink_steps"} & set(entry.doc), entry.doc  # how it was found stays behind
    assert entry.doc == kept(load_finding(found[0])[1], found[0].name)  # one schema: the finding's, less the run
    assert coc_corpus(["add", *map(str, found), "--to", str(corpus)]) == 0
    assert "0 added, 4 already" in capsys.readouterr().out
    (tmp_path / "found" / "broken.json").write_text("{")
    assert coc_corpus(["add", str(tmp_path / "found" / "broken.json"), "--to", str(corpus)]) == 2


class _Ranks:
    """Ranks nothing runs on: every kind's judging is replaced."""

    timings = CaseTimings()

    def run(self, fn: Any, world_size: int, **params: Any) -> list[Any]:
        raise AssertionError("nothing runs")


def test_an_exploration_replays_its_corpus_first_then_mutates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from coc_impl.reference import ReferenceCoC
    from conformance.explore import explorer as explorer_module
    from conformance.explore.registry import kind_of

    judged: list[Any] = []

    def passing(spec: Any) -> Any:
        def judge(ranks: Any, case: Any, scope: Any, verdicts: Any) -> Judged:
            judged.append(case)
            return Judged()
        return replace(kind_of(spec), judge=judge)

    monkeypatch.setattr(explorer_module, "kind_of", passing)
    impl = ReferenceCoC()
    scope = replace(Scope.of(impl, declarations(impl)), tp_sizes=frozenset({1, 2, 4}))
    corpus = [OpSpec((Call(40, 8, 8),), tp=2), OpSpec((Call(4, 3, 1),), tp=3), ConfigSpec(chunks="16")]
    ticks = itertools.count()
    report = Explorer(_Ranks(), seed=4, budget_s=3.0, scope=scope, clock=lambda: next(ticks) * 0.01,
                      corpus=corpus).explore()
    assert judged[:2] == [corpus[0], corpus[2]], judged[:3]  # the TP 3 case is out of reach: counted, not run
    assert report.from_corpus == 2 and report.outside["TP 3 is not among --coc-tp 1,2,4"] >= 1
    assert 0 < report.mutations < report.cases - 2, report.as_dict()
    assert report.as_dict()["from_corpus"] == 2 and report.as_dict()["mutations"] == report.mutations
    plain = Explorer(_Ranks(), seed=4, budget_s=3.0, scope=scope, clock=lambda: next(ticks) * 0.01).explore()
    assert plain.from_corpus == plain.mutations == 0


def test_files_of_schema_2_still_read_as_schema_3(tmp_path: Path) -> None:
    """A corpus entry of schema 2 is this form; an explorer finding of schema 2 held its seed alone."""
    spec = OpSpec((Call(3, 2, 1),), tp=1)
    entry = tmp_path / "entry.json"
    entry.write_text(json.dumps({"schema": 2, "check": "numerics", "level": "MUST", "category": "x",
                                 "case": spec.describe(), "spec": spec.as_dict(), "minimal": True, "message": "m",
                                 "provenance": {"seed": 1, "date": "2026-01-01", "implementation": "a:B",
                                                "from": "f.json"}}))
    finding = tmp_path / "finding.json"
    finding.write_text(json.dumps({"schema": 2, "check": "numerics", "spec": spec.as_dict(), "seed": 5,
                                   "command": "pytest --coc-impl a:B --coc-replay finding.json"}))
    (_, old_entry), (_, old_finding) = load_finding(entry), load_finding(finding)
    assert old_entry["schema"] == old_finding["schema"] == SCHEMA
    assert old_entry["provenance"] == {"seed": 1, "date": "2026-01-01", "implementation": "a:B", "from": "f.json"}
    assert old_finding["provenance"]["seed"] == 5 and old_finding["provenance"]["implementation"] == ""
    assert "seed" not in old_finding and old_finding["subject"] == "" and old_finding["check"] == "numerics"
