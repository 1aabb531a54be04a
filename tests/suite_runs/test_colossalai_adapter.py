"""The ColossalAI adapter (``conformance/adapters/colossalai.py``) against ColossalAI 0.5.0 from the registry.

The sdist is fetched once with pip into a cache directory (or taken from
``COLOSSALAI_SRC``); where the registry cannot be reached the tests that need
it skip, saying why.  With it: the ops at TP 2 with the shipped
expectations are green, and without them the ring all-gather's wrong gathered
input fails MUST, naming the rows each rank gets wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from conformance.adapters import colossalai as adapter
from tests.support import ROOT
from tests.support.adapter_runs import OPS_TP2, adapter_run, assert_green, failed_checks
from tests.support.suite_run import SuiteRun

IMPL = "conformance.adapters.colossalai:ColossalAIRing"
EXPECTATIONS = ROOT / "conformance" / "adapters" / "colossalai.expectations.toml"
VERSION = "0.5.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "coc-conformance"


def _fetch_source() -> tuple[Path | None, str]:
    """ColossalAI's source tree (``COLOSSALAI_SRC``, the cache, or pip), or None and why not."""
    if os.environ.get(adapter.SOURCE_ENV):
        return Path(os.environ[adapter.SOURCE_ENV]), ""
    root = CACHE / f"colossalai-{VERSION}"
    if (root / adapter.OPERATION_FILE).is_file():
        return root, ""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            fetched = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                 "--dest", tmp, f"colossalai=={VERSION}"], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return None, f"pip download colossalai=={VERSION} timed out (is the registry reachable?)"
        sdists = list(Path(tmp).glob("colossalai-*.tar.gz"))
        if fetched.returncode or not sdists:
            return None, f"pip download colossalai=={VERSION} failed: {fetched.stderr.strip()[-400:]}"
        CACHE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdists[0]) as archive:
            archive.extractall(CACHE, filter="data")
    return root, ""


@pytest.fixture(scope="module")
def colossalai_src() -> Path:
    root, why = _fetch_source()
    if root is None:
        pytest.skip(why)
    return root


@pytest.fixture
def run_colossalai(run_suite: Callable[..., SuiteRun], colossalai_src: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Callable[..., SuiteRun]:
    monkeypatch.setenv(adapter.SOURCE_ENV, str(colossalai_src))
    return run_suite


def test_without_source_the_adapter_says_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(adapter.SOURCE_ENV, str(tmp_path))
    with pytest.raises(ImportError, match=f"{adapter.SOURCE_ENV}=.* has no .*_operation.py.*pip download"):
        adapter.operation_file()


def test_ops_at_tp2_are_green_with_the_shipped_expectations(run_colossalai: Callable[..., SuiteRun],
                                                              tmp_path: Path) -> None:
    run, summary = adapter_run(run_colossalai, tmp_path, "test_ops", IMPL, *OPS_TP2,
                               "-n", "2", expectations=EXPECTATIONS)
    known = assert_green(run, summary)
    passed = [c["id"] for c in summary["cases"] if c["outcome"] == "passed"]
    assert any("[all_gather_matmul-" in c for c in passed) and any("[matmul_reduce_scatter-" in c for c in passed)
    # What is known is ColossalAI's: the ring's gathered input, and a token count refused without saying why.
    assert known, "the expectations file matched no failure (is it still needed?)"
    for case in known:
        assert failed_checks(case), f"{case['id']}: known failure without a failed check"
        for check in failed_checks(case):
            assert check["level"] == "MUST", (case["id"], check)
            assert "gathered input" in check["message"] or "not a clear refusal" in check["message"], check


def test_ring_gather_defect_fails_naming_each_ranks_rows(run_colossalai: Callable[..., SuiteRun],
                                                         tmp_path: Path) -> None:
    run, summary = adapter_run(run_colossalai, tmp_path, "test_ops", IMPL, "--coc-tp", "2", "-k",
                               "test_exact_layout and all_gather_matmul_v2 and float32")
    (case,) = summary["cases"]
    assert run.ret == pytest.ExitCode.TESTS_FAILED and case["outcome"] == "failed", run.output[-4000:]
    (check,) = failed_checks(case)
    # 24 tokens per rank: rank 0 holds its own shard where rank 1's belongs (rows 0-23 of rank 1's shard are wrong).
    assert check["level"] == "MUST" and "gathered input" in check["message"], check
    assert "rank 0's gathered input" in check["message"] and "rank 1 rows 0-23" in check["message"], check
