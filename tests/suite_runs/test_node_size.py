"""A case never runs on fewer devices than it needs, and ``--coc-tp`` selects every case by its TP
(docs/DESIGN.md#leases-and-node-size).

Both are asserted on the run's own records: the JSON summary's skip reasons,
and the parameters of the cases collected, read here independently of the
suite's own reading (``conformance.caseids.needs``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import ROOT

PERF_TP2 = "test_perf.py::test_coc_gain_meets_profile[cpu-gloo/balanced-rs-tp2]"

EXCLUSIVE_CASE = '''
import pytest

from tests.support.rank_cases import whoami


@pytest.mark.coc_capability("node-size")
def test_exclusive_pair(coc_ranks):
    """Declares no sizes as parameters: only the run itself asks for two ranks, on the whole node."""
    coc_ranks.run(whoami, 2, exclusive=True)
'''

#: A plugin for the collecting subprocess: every selected case's raw parameters, as data.
DUMP_PARAMS = '''
import json, os


def pytest_collection_finish(session):
    def plain(value):
        if isinstance(value, (int, str, float, bool)) or value is None:
            return value
        return {"tp": getattr(value, "tp", None), "repr": repr(value)[:80]}

    cases = {item.nodeid: {k: plain(v) for k, v in getattr(getattr(item, "callspec", None), "params", {}).items()}
             for item in session.items}
    with open(os.environ["DUMP_PARAMS_TO"], "w") as f:
        json.dump(cases, f)
'''


def _pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run_pytest: Callable[..., pytest.RunResult],
            *args: str) -> pytest.RunResult:
    pytester.chdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), str(pytester.path),
                                                                   os.environ.get("PYTHONPATH")])))
    return run_pytest("-p", "no:cacheprovider", "-q", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
                      *args, timeout=300)


def test_a_node_of_one_slot_skips_a_tp2_perf_case_and_an_exclusive_pair(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        run_pytest: Callable[..., pytest.RunResult]) -> None:
    """Neither is started on the one slot (no hang, no crash): each skips saying what it needs."""
    pytester.makepyfile(test_exclusive=EXCLUSIVE_CASE)
    summary = tmp_path / "summary.json"
    result = _pytest(pytester, monkeypatch, run_pytest, "--coc-cpu-slots", "1", "--coc-summary", str(summary),
                     "--coc-lease-dir", str(tmp_path / "leases"), "-n", "0",
                     str(pytester.path / "test_exclusive.py"),
                     "--pyargs", f"conformance.suite.{PERF_TP2.replace('.py', '', 1)}")
    doc = json.loads(summary.read_text())
    by_id = {case["id"]: case for case in doc["cases"]}
    assert len(by_id) == 2 and PERF_TP2 in by_id, result.stdout.str()
    assert any(case_id.endswith("::test_exclusive_pair") for case_id in by_id)
    for case in by_id.values():
        assert case["outcome"] == "skipped", case
        assert case["skip_reason"].startswith("needs 2 devices, this node has 1"), case
    assert doc["outcomes"] == {"skipped": 2} and not doc["missing"]


def _collected(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
               run_pytest: Callable[..., pytest.RunResult], *args: str) -> dict[str, dict[str, object]]:
    pytester.makepyfile(dump_params=DUMP_PARAMS)
    dump = tmp_path / f"collected{len(args)}.json"
    monkeypatch.setenv("DUMP_PARAMS_TO", str(dump))
    result = _pytest(pytester, monkeypatch, run_pytest, "-p", "dump_params", "--collect-only", "-n", "0",
                     "--pyargs", "conformance.suite", *args)
    assert result.ret == 0, result.stdout.str()
    cases: dict[str, dict[str, object]] = json.loads(dump.read_text())
    return cases


def _sizes(params: dict[str, object]) -> set[int]:
    """Every size a case's parameters name: ints under a TP or world name, or a parameter's ``tp`` (0 is a case run
    in the test process: it forms no TP group)."""
    found: set[int] = set()
    for name, value in params.items():
        if isinstance(value, int) and not isinstance(value, bool) and ("tp" in name or "world" in name):
            found.add(value)
        if isinstance(value, dict) and isinstance(value.get("tp"), int) and value["tp"] > 0:
            found.add(value["tp"])
    return found


def test_coc_tp_1_deselects_every_tp2_and_tp8_case_perf_included(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        run_pytest: Callable[..., pytest.RunResult]) -> None:
    every = _collected(pytester, monkeypatch, tmp_path, run_pytest)
    chosen = _collected(pytester, monkeypatch, tmp_path, run_pytest, "--coc-tp", "1")
    larger = {nodeid for nodeid, params in every.items() if _sizes(params) & {2, 8}}
    perf = {nodeid for nodeid in larger if "test_perf.py" in nodeid}
    assert perf and len(larger) > len(perf)  # the whole run has TP 2 and TP 8 cases, perf ones among them
    assert chosen and set(chosen) <= set(every)
    assert not set(chosen) & larger
    assert all(_sizes(params) <= {1} for params in chosen.values())
    assert any(_sizes(params) == {1} for params in chosen.values())
