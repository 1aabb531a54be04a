"""The explorer end to end (docs/DESIGN.md#explorer): a fault the catalogue misses is found, shrunk and replayed;
the reference passes an exploration."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conformance.explore.finding import SCHEMA
from conformance.explore.op_spec import Call, OpSpec
from tests.support.suite_run import SuiteRun

FAULT = "tests.support.faulty_impls:UnalignedKBias"


def _own_leases(tmp_path: Path) -> tuple[str, str]:
    """A lease queue of the run's own: shrinking has a share of a short budget, not to be spent queueing."""
    return "--coc-lease-dir", str(tmp_path / "leases")


def _exploration(summary: Path) -> tuple[dict[str, object], dict[str, object]]:
    case = json.loads(summary.read_text())["cases"][0]
    return case, case["explore"]


def test_a_fault_is_explored_to_a_minimal_case_that_replays(run_suite: Callable[..., SuiteRun],
                                                            tmp_path: Path) -> None:
    """Drawn, not replayed: the shipped corpus, which holds this fault's minimal case, is left out."""
    found = tmp_path / "found"
    run = run_suite("test_explore", FAULT, "--coc-explore", "12", "--coc-seed", "1", "--coc-explore-dir", str(found),
                    "--coc-summary", str(tmp_path / "explore.json"), "--coc-no-shipped-corpus", *_own_leases(tmp_path))
    assert run.ret == 1, run.output
    case, explored = _exploration(tmp_path / "explore.json")
    failed = [c for c in case["checks"] if c["outcome"] == "failed"]
    assert ("numerics", "MUST", "numeric mismatch") in [(c["name"].split(": ")[-1], c["level"], c["category"])
                                                         for c in failed]
    findings = [json.loads(f.read_text()) for f in sorted(found.glob("*numerics-*.json"))]
    finding = next((f for f in findings if f["minimal"]), findings[0])  # one per op it is found in
    spec_file = Path(finding["path"])
    # Minimal: a bias and a k no multiple of 4 is the corner; every simpler neighbour ran and passed.
    assert finding["minimal"] and finding["case"].endswith(" tp1 [1x1x1 float32 +bias]"), finding
    assert f"--coc-replay {spec_file}" in finding["command"] and explored["cases"] >= 1  # type: ignore[operator]

    replay = run_suite("test_explore", FAULT, "--coc-replay", str(spec_file), "--coc-summary",
                       str(tmp_path / "replay.json"), *_own_leases(tmp_path))
    assert replay.ret == 1, replay.output
    replayed = json.loads((tmp_path / "replay.json").read_text())["cases"][0]
    assert replayed["id"].endswith("test_replay")
    assert [(c["name"], c["category"]) for c in replayed["checks"] if c["outcome"] == "failed"] == \
        [(finding["name"], "numeric mismatch")]  # the one check its minimal case was shrunk to fail
    assert finding["name"] == f"{finding['subject']}: numerics" and finding["subject"], finding


def test_the_reference_passes_an_exploration(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    run = run_suite("test_explore", "coc_impl.reference:ReferenceCoC", "--coc-explore", "5", "--coc-seed", "2",
                    "--coc-explore-dir", str(tmp_path / "found"), "--coc-summary", str(tmp_path / "explore.json"),
                    *_own_leases(tmp_path))
    assert run.ret == 0, run.output
    _, explored = _exploration(tmp_path / "explore.json")
    assert explored["findings"] == [] and explored["cases"] > 1, explored  # type: ignore[operator]
    assert explored["from_corpus"] > 0, explored  # the shipped corpus first, then draws and mutations
    assert not (tmp_path / "found").exists()


def test_explorer_options_refuse_bad_values(run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for args in (("--coc-explore", "-1"), ("--coc-replay", str(bad)), ("--coc-replay", str(tmp_path / "none.json")),
                 ("--coc-explore", "5", "--coc-replay", str(bad))):
        run = run_suite("test_explore", "coc_impl.reference:ReferenceCoC", *args)
        assert run.ret == 4, (args, run.output)  # a usage error (its message goes to stderr)


def test_a_configuration_fault_is_found_shrunk_and_replayed_in_process(run_suite: Callable[..., SuiteRun],
                                                                       tmp_path: Path) -> None:
    """A kind apart from the ops: a chunk count below one clamped, found among the drawn configurations (of an
    implementation that offers nothing else, so no other kind is drawn)."""
    fault, found = "tests.support.faulty_impls:ClampsChunkCountConfigureOnly", tmp_path / "found"
    run = run_suite("test_explore", fault, "--coc-explore", "6", "--coc-seed", "3", "--coc-explore-dir", str(found),
                    "--coc-summary", str(tmp_path / "explore.json"), "--coc-no-shipped-corpus", *_own_leases(tmp_path))
    assert run.ret == 1, run.output
    _, explored = _exploration(tmp_path / "explore.json")
    assert explored["per_kind"]["config"]["cases"] > 0, explored  # type: ignore[index]
    assert set(explored["not_offered"]) == {"op", "layer", "w8a16"}, explored  # type: ignore[arg-type]
    assert len(explored["findings"]) == 1, explored  # type: ignore[arg-type]
    (spec_file,) = found.glob("*refused--naming-the-setting-*.json")
    finding = json.loads(spec_file.read_text())
    assert finding["minimal"] and finding["spec"]["kind"] == "config", finding
    assert finding["spec"]["chunks"] in ("0", "-1") and finding["spec"]["incompatible"] == "none", finding
    replay = run_suite("test_explore", fault, "--coc-replay", str(spec_file), "--coc-summary",
                       str(tmp_path / "replay.json"), *_own_leases(tmp_path))
    assert replay.ret == 1, replay.output


def test_refusing_every_call_fails_at_must_and_lacking_a_mode_passes_with_it_not_offered(
        run_suite: Callable[..., SuiteRun], tmp_path: Path) -> None:
    """The refusal rule and the NotImplementedError rule end to end, on the JSON summary (the refusal found by
    drawing: the shipped corpus, replayed first, would spend the 5 s on its own cases' refusals)."""
    run = run_suite("test_explore", "tests.support.faulty_impls:RefusesEveryCall", "--coc-explore", "5",
                    "--coc-seed", "1", "--coc-explore-dir", str(tmp_path / "found"), "--coc-no-shipped-corpus",
                    "--coc-summary", str(tmp_path / "refuses.json"), *_own_leases(tmp_path))
    assert run.ret == 1, run.output
    case, explored = _exploration(tmp_path / "refuses.json")
    failed = [(c["name"].split(": ")[-1], c["level"]) for c in case["checks"] if c["outcome"] == "failed"]
    assert ("the op ran on every rank", "MUST") in failed, failed
    ran = [f for f in explored["findings"] if f["check"] == "the op ran on every rank"]  # type: ignore[attr-defined]
    assert ran and min(f["found_after_s"] for f in ran) < 30, explored["findings"]

    # A corpus of one deterministic case, replayed first: the mode is met whatever the draws.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    deterministic = OpSpec((Call(48, 96, 64),), tp=3, deterministic=True, runs=2)
    (corpus / "deterministic.json").write_text(json.dumps({"schema": SCHEMA, "spec": deterministic.as_dict()}))
    lacking = run_suite("test_explore", "tests.support.faulty_impls:NoDeterministicMode", "--coc-explore", "8",
                        "--coc-seed", "3", "--coc-explore-dir", str(tmp_path / "found2"), "--coc-corpus", str(corpus),
                        "--coc-no-shipped-corpus",
                        "--coc-summary", str(tmp_path / "lacking.json"), *_own_leases(tmp_path))
    assert lacking.ret == 0, lacking.output
    case, explored = _exploration(tmp_path / "lacking.json")
    assert case["outcome"] == "passed" and explored["findings"] == [], explored
    assert explored["per_dimension"]["op.deterministic=True"] >= 1, explored  # type: ignore[index]
    assert any("deterministic" in modes for modes in explored["not_offered"]), explored  # type: ignore[attr-defined]
    assert any(c["outcome"] == "passed" for c in case["checks"]), case  # the rest of what it drew was judged
