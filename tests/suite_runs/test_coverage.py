"""No silent holes: the catalogue check flags a parametrisation that drops a combination."""

from __future__ import annotations

import subprocess
import sys

from conformance.suite.coverage import holes, keys
from tests.support import ROOT


def _cases() -> list[tuple[str, dict[str, object]]]:
    return [("test_exact_layout", {"op": op, "dtype": dtype, "tp": tp})
            for op in ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "all_gather_matmul_v2")
            for dtype in ("float32", "bfloat16", "float16") for tp in (2, 8)]


def test_complete_parametrisation_has_no_holes() -> None:
    assert holes(_cases()) == {}


def test_a_dropped_combination_is_named() -> None:
    cases = [c for c in _cases() if not (c[1]["dtype"] == "bfloat16" and c[1]["tp"] == 8)]
    found = holes(cases)
    assert set(found) == {"test_exact_layout"}
    assert ("matmul_all_reduce", "bfloat16", 8) in found["test_exact_layout"]


def test_golden_cases_are_read_from_the_catalogue() -> None:
    found = keys("test_layer_matches_golden", {"case_id": "layer-row-sp-s32b2-h48x96-float32-bias", "tp": 4,
                                               "chunks": 2})
    assert found == {"test_layer_matches_golden": ("row", True, "float32", 4),
                     "test_layer_matches_golden/chunks": ("row", True, 2)}


def test_the_suite_collects_without_holes() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q",
                           "conformance/suite"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_check_sees_the_collection_before_deselection() -> None:
    """``--coc-tp``, ``-m``, ``-k`` and torchrun's world size narrow the run, not the catalogue."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--co", "-q",
                           "conformance/suite", "--coc-tp", "2", "-m", "not perf", "-k", "not golden"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " deselected" in done.stdout.splitlines()[-1]
