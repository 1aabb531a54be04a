"""Choosing the smoke tier (``python -m conformance.bench tiers``): the cover, the kills, the kept runs."""

from __future__ import annotations

from pathlib import Path

from conformance.bench import fault_sources
from conformance.bench.kill_runs import Candidate, RunStore
from conformance.bench.tier_choice import cheapest_cover, check_name, kills, requirements
from tests.support.proofs import MUST, SHOULD, Proof


def test_the_cover_meets_every_requirement_at_little_cost() -> None:
    meets = {"dear": {"b", "c", "d"}, "cheap-b": {"b", "c"}, "cheap-d": {"d"}, "extra": {"c"}}
    cost = {"dear": 10.0, "cheap-b": 1.0, "cheap-d": 1.0, "extra": 0.1}
    # "extra" is the cheapest per requirement, and picked first; "cheap-b" then makes it redundant: it is dropped
    assert cheapest_cover(meets, cost) == ["cheap-b", "cheap-d"]


def test_a_check_is_named_without_its_cases_label() -> None:
    assert check_name("m=13 (13 rows per rank), 8 chunks: numerics") == "numerics"
    assert check_name("row SP: token counts: declared shape error") == "declared shape error"
    assert check_name("numerics") == "numerics"


def _store(tmp_path: Path) -> RunStore:
    store = RunStore(tmp_path / "runs.json")
    store.align("test_ops", ["test_ops.py::test_a[tp2]", "test_ops.py::test_a[tp8]", "test_ops.py::test_b[tp2]"])
    return store


def test_a_case_catches_a_row_when_its_record_alone_shows_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    failed = {"name": "numerics", "level": MUST, "outcome": "failed", "passed": False, "category": "numeric mismatch",
              "message": "off"}
    store.keep_fault("test_ops", "Wrong", "d1", store.candidates["test_ops"], [
        {"id": "test_ops.py::test_a[tp2]", "outcome": "failed", "checks": [failed]},
        {"id": "test_ops.py::test_a[tp8]", "outcome": "passed", "checks": [{**failed, "outcome": "passed"}]},
    ])
    rows = [Proof("test_ops", "Wrong", "", "numerics", MUST, "numeric mismatch"),
            Proof("test_ops", "Wrong", "", "numerics", SHOULD, "numeric mismatch")]
    judged = set(store.candidates["test_ops"])
    assert kills(rows, store, judged) == {rows[0].key: ["test_ops.py::test_a[tp2]"], rows[1].key: []}
    assert kills(rows, store, judged - {"test_ops.py::test_a[tp2]"})[rows[0].key] == []  # not judged by the reference


def test_only_what_changed_runs_again(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ran = store.candidates["test_ops"]
    store.keep_fault("test_ops", "Wrong", "d1", ran, [{"id": ran[0], "outcome": "failed", "checks": []}])
    store.save()
    store = RunStore(tmp_path / "runs.json")
    assert store.fault_needed("test_ops", "Wrong", "d1", rerun=False) == []
    assert store.fault_needed("test_ops", "Wrong", "d2", rerun=False) == ran  # its source changed
    assert store.fault_needed("test_ops", "New", "d1", rerun=False) == ran
    store.align("test_ops", [*ran[1:], "test_ops.py::test_c[tp2]"])  # one case gone, one new
    assert store.fault_needed("test_ops", "Wrong", "d1", rerun=False) == ["test_ops.py::test_c[tp2]"]
    assert ran[0] not in store.records("test_ops", "Wrong")


def test_requirements_hold_each_check_and_kind_at_its_largest_tp(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.keep_reference([
        {"id": "test_ops.py::test_a[tp2]", "outcome": "passed", "duration": 0.1,
         "checks": [{"name": "m=2: numerics", "level": MUST}]},
        {"id": "test_ops.py::test_a[tp8]", "outcome": "passed", "duration": 0.1,
         "checks": [{"name": "m=8: numerics", "level": MUST}]},
        {"id": "test_ops.py::test_b[tp2]", "outcome": "passed", "duration": 0.1,
         "checks": [{"name": "exact layout", "level": MUST}]},
    ])
    candidates = [Candidate("test_ops.py::test_a[tp2]", 2, "op:x"), Candidate("test_ops.py::test_a[tp8]", 8, "op:x"),
                  Candidate("test_ops.py::test_b[tp2]", 2, "op:y")]
    met = requirements(candidates, store, {"row": ["test_ops.py::test_a[tp2]"]})
    assert met["test_ops.py::test_a[tp8]"] == {"test test_ops.py::test_a", "check test_ops MUST 'numerics' at TP 8",
                                               "kind op:x at TP 8"}
    assert met["test_ops.py::test_a[tp2]"] == {"test test_ops.py::test_a", "catches row"}
    assert cheapest_cover(met, {c.id: 1.0 for c in candidates}) == [
        "test_ops.py::test_a[tp2]", "test_ops.py::test_a[tp8]", "test_ops.py::test_b[tp2]"]


def test_a_faults_digest_follows_what_it_uses_of_its_module() -> None:
    source = ("class _Base:\n    pass\n\n\ndef helper():\n    return {}\n\n\n"
              "class Fault(_Base):\n    def f(self):\n        return helper()\n\n\nclass Other:\n    pass\n")

    def digest(text: str) -> str:
        return fault_sources.source_digest(text, "Fault")

    base = digest(source)
    assert digest(source.replace("class Other:\n    pass", "class Other:\n    x = 1")) == base
    assert digest(source.replace("return {}", "return []")) != base
    assert digest(source.replace("class _Base:\n    pass", "class _Base:\n    y = 2")) != base


def test_a_faults_digest_follows_its_helpers_into_the_other_modules_of_its_package() -> None:
    shared = "class _Base:\n    pass\n\n\ndef helper():\n    return {}\n"
    family = ("from pkg._shared import _Base, helper\n\n\n"
              "class Fault(_Base):\n    def f(self):\n        return helper()\n")
    other = "class Other:\n    pass\n"

    def digest(*sources: str) -> str:
        return fault_sources.source_digest(sources, "Fault")

    base = digest(shared, family, other)
    assert digest(shared, family, other.replace("pass", "x = 1")) == base
    assert digest(shared.replace("return {}", "return []"), family, other) != base
    assert digest(shared.replace("pass", "y = 2"), family, other) != base


def test_the_faults_package_gives_the_source_of_every_fault_of_the_proof_table() -> None:
    from tests.support import faulty_impls
    from tests.support.proofs import FAULT_TABLE

    sources = fault_sources.module_sources(faulty_impls)
    for row in FAULT_TABLE:
        assert any(f"\nclass {row.fault}(" in source or f"\nclass {row.fault}:" in source for source in sources), row
