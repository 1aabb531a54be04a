"""The corpus end to end (docs/DESIGN.md#explorer): kept cases fail what they were kept for, in every tier.

Each explorer-only fault fails its shipped minimal case; the reference passes
the whole shipped corpus; the smoke tier and the full suite fail an
implementation that accepts chunk count 0; a finding of one exploration,
added with ``coc-corpus add``, fails a later plain smoke run given the corpus
and passes the reference; a malformed spec is a usage error naming its file;
an exploration replays the corpus first and mutates it.  Every assertion is
on the JSON summary.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.explore.corpus import SHIPPED, read_corpus
from conformance.explore.corpus_cli import main as coc_corpus
from tests.support.explorer_faults import EXPLORER_FAULTS
from tests.support.shipped_corpus import FAULT_CASES
from tests.support.suite_run import SuiteRun

REFERENCE = "coc_impl.reference:ReferenceCoC"
FAULTS = "tests.support.faulty_impls"


def _leases(tmp_path: Path) -> tuple[str, str]:
    return "--coc-lease-dir", str(tmp_path / "leases")


def _cases(summary: Path) -> list[dict[str, Any]]:
    return json.loads(summary.read_text())["cases"]  # type: ignore[no-any-return]


def _failed(case: dict[str, Any]) -> list[str]:
    """The case's failed checks, by the check's own name (a recorded name may lead with what it is about:
    ``matmul_all_reduce: numerics``)."""
    names = [c["name"] for c in case["checks"] if c["outcome"] == "failed"]
    return names + [name.split(": ", 1)[1] for name in names if ": " in name]


def _case_id(spec: Any) -> str:
    from conformance.explore.registry import kind_of
    from conformance.explore.spec import spec_key

    return f"{kind_of(spec).name}-{spec_key(spec)}"


@pytest.mark.parametrize("row", EXPLORER_FAULTS, ids=lambda row: row.fault)
def test_each_explorer_only_fault_fails_its_shipped_case(run_suite: Callable[..., SuiteRun], tmp_path: Path,
                                                          row: Any) -> None:
    case_id = _case_id(FAULT_CASES[row.fault])
    run = run_suite("test_corpus", f"{FAULTS}:{row.fault}", "-k", case_id, "--coc-summary",
                    str(tmp_path / "s.json"), *_leases(tmp_path))
    assert run.ret == 1, run.output
    (case,) = _cases(tmp_path / "s.json")
    assert case["id"] == f"test_corpus.py::test_corpus[{case_id}]" and row.check in _failed(case), case


def test_the_reference_passes_the_shipped_corpus(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    run = run_suite("test_corpus", REFERENCE, "--coc-summary", str(tmp_path / "s.json"), *_leases(tmp_path))
    assert run.ret == 0, run.output
    cases = _cases(tmp_path / "s.json")
    assert len(cases) == len(read_corpus([SHIPPED]))
    assert {c["outcome"] for c in cases} == {"passed"}, [c for c in cases if c["outcome"] != "passed"]


def test_smoke_fails_an_implementation_accepting_chunk_count_zero(run_suite: Callable[..., SuiteRun],
                                                                   tmp_path: Path) -> None:
    """The fixed configuration cases never try a count below one; the shipped corpus does, in the smoke tier."""
    impl = f"{FAULTS}:ClampsChunkCountConfigureOnly"
    zero = f"test_corpus.py::test_corpus[{_case_id(FAULT_CASES['ClampsChunkCountBelowOne'])}]"
    for tier in ("smoke", "not perf"):  # the smoke tier, and the full suite (its perf gates need a profile)
        summary = tmp_path / f"{tier.replace(' ', '-')}.json"
        run = run_suite("", impl, "-m", tier, "-n", "2", "--coc-summary", str(summary), *_leases(tmp_path))
        assert run.ret == 1, run.output
        failed = {c["id"]: _failed(c) for c in _cases(summary) if c["outcome"] == "failed"}
        assert "refused, naming the setting" in failed.get(zero, []), failed


def test_a_finding_added_to_a_corpus_stays_found(run_suite: Callable[..., SuiteRun], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Explore (its own draws only), add the finding with coc-corpus, replay it in a plain smoke run."""
    fault, found, corpus = f"{FAULTS}:ClampsChunkCountConfigureOnly", tmp_path / "found", tmp_path / "corpus"
    explored = run_suite("test_explore", fault, "--coc-explore", "6", "--coc-seed", "3", "--coc-no-shipped-corpus",
                         "--coc-explore-dir", str(found), "--coc-summary", str(tmp_path / "e.json"),
                         *_leases(tmp_path))
    assert explored.ret == 1, explored.output
    findings = sorted(found.glob("*.json"))
    assert findings and coc_corpus(["add", *map(str, findings), "--to", str(corpus)]) == 0
    assert coc_corpus(["add", *map(str, findings), "--to", str(corpus)]) == 0  # again: nothing new
    assert f"0 added, {len(findings)} already" in capsys.readouterr().out
    (entry,) = read_corpus([corpus])
    assert entry.doc["provenance"]["seed"] == 3 and entry.doc["provenance"]["implementation"] == fault
    assert entry.doc["provenance"]["date"], entry.doc
    kept = f"test_corpus.py::test_corpus[{entry.case_id}]"
    # A plain smoke run given the corpus; then one without the shipped corpus, which may hold the same case.
    for alone in ((), ("--coc-no-shipped-corpus",)):
        summary = tmp_path / f"later{len(alone)}.json"
        later = run_suite("", fault, "-m", "smoke", "--coc-corpus", str(corpus), *alone, "--coc-summary",
                          str(summary), *_leases(tmp_path))
        assert later.ret == 1, later.output
        replayed = {c["id"]: c for c in _cases(summary) if "test_corpus" in c["id"]}
        assert kept in replayed and entry.doc["check"] in _failed(replayed[kept]), replayed
    assert list(replayed) == [kept], replayed
    # The reference passes the same smoke tier's corpus cases (the rest of it is proved elsewhere).
    reference = run_suite("test_corpus", REFERENCE, "-m", "smoke", "--coc-corpus", str(corpus), "--coc-summary",
                          str(tmp_path / "ref.json"), *_leases(tmp_path))
    assert reference.ret == 0, reference.output
    outcomes = {c["id"]: c["outcome"] for c in _cases(tmp_path / "ref.json")}
    assert outcomes[kept] == "passed" and set(outcomes.values()) == {"passed"}, outcomes


def test_corpus_cases_are_selected_by_their_tp_and_skip_out_of_reach_or_not_offered_saying_why(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """``--coc-tp`` selects corpus cases by the TP they run at, as it selects every case (a configuration, run in
    the test process, whatever it says); a case needing more ranks than the node has, or of a kind the
    implementation does not offer, skips saying why."""
    run = run_suite("test_corpus", f"{FAULTS}:ClampsChunkCountConfigureOnly", "--coc-tp", "3",
                    "--coc-summary", str(tmp_path / "s.json"), *_leases(tmp_path))
    assert run.ret == 1, run.output  # chunk count 0 still fails
    cases = _cases(tmp_path / "s.json")
    reasons = {c["skip_reason"] for c in cases if c["outcome"] == "skipped"}
    assert any(r.startswith("not offered: ") for r in reasons), reasons
    tp3 = f"test_corpus.py::test_corpus[{_case_id(FAULT_CASES['WrongAtTp3'])}]"
    at_tp3 = {f"test_corpus.py::test_corpus[{e.case_id}]" for e in read_corpus([SHIPPED])
              if not e.case_id.startswith("config-") and getattr(e.spec, "tp", None) == 3}
    assert tp3 in at_tp3 and {c["id"] for c in cases if "[config-" not in c["id"]} == at_tp3, \
        [c["id"] for c in cases]
    reference = run_suite("test_corpus", REFERENCE, "--coc-cpu-slots", "1", "-k", "op or layer or w8a16",
                          "--coc-summary", str(tmp_path / "r.json"), *_leases(tmp_path))
    assert reference.ret == 0, reference.output
    outcomes = {c["id"]: (c["outcome"], c.get("skip_reason", "")) for c in _cases(tmp_path / "r.json")}
    skipped = [why for outcome, why in outcomes.values() if outcome == "skipped"]
    assert skipped and {o for o, _ in outcomes.values()} <= {"passed", "skipped"}, outcomes
    assert all(re.fullmatch(r"needs \d+ devices, this node has 1", why) for why in skipped), outcomes


def test_a_malformed_spec_is_a_usage_error_naming_its_file(run_suite: Callable[..., SuiteRun],
                                                           tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    bad = corpus / "bad.json"
    bad.write_text(json.dumps({"schema": 2, "spec": {"kind": "config", "chunks": "2", "tp_size": 99}}))
    for given in (("--coc-corpus", str(corpus)), ("-o", f"coc_corpus={corpus}")):  # the option, the ini key
        run = run_suite("test_corpus", REFERENCE, *given)
        assert run.ret == 4, (given, run.output)  # a usage error, its message (naming the file) on stderr


def test_an_exploration_replays_the_corpus_then_mutates_it(run_suite: Callable[..., SuiteRun],
                                                           tmp_path: Path) -> None:
    # a budget that fits the corpus's pool starts (TP 1, 2, 3) under load, and mutations after it
    run = run_suite("test_explore", REFERENCE, "--coc-explore", "20", "--coc-seed", "5", "--coc-explore-dir",
                    str(tmp_path / "found"), "--coc-summary", str(tmp_path / "e.json"), *_leases(tmp_path))
    explored = _cases(tmp_path / "e.json")[0]["explore"]
    shipped = len(read_corpus([SHIPPED]))
    assert explored["from_corpus"] == shipped and not explored["outside"], explored
    assert 0 < explored["mutations"] < explored["cases"] - shipped, explored
    # The reference passes every corpus case (above); what the mutations and draws find is a finding like any.
    assert run.ret == (1 if explored["findings"] else 0), run.output
