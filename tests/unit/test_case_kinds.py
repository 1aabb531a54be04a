"""A case's kind comes from its ``coc_kind`` marker, never from its file's name: the report's feature and the
explorer's plugin find the same cases whatever the suite's modules are called."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import ROOT


def suite_module(kind: str, *tests: str) -> str:
    """A module as the suite writes one: its kind marked once, then its tests."""
    return f"import pytest\n\npytestmark = pytest.mark.coc_kind({kind!r})\n" + \
        "".join(f"\n\ndef {test}():\n    pass\n" for test in tests)


#: Op cases (the tests save the module under two names), and the explorer's two tests in a module its plugin has
#: never heard the name of.
OPS = suite_module("op", "test_numerics", "test_w8a16_by_name") + \
    '\n\n@pytest.mark.coc_kind("w8A16")\ndef test_quantised():\n    pass\n'
EXPLORER = suite_module("explore", "test_explore", "test_replay")


def _features(results: Path) -> dict[str, str]:
    """Each Allure result's ``module#test`` -> its feature label."""
    docs = (json.loads(path.read_text()) for path in results.glob("*-result.json"))
    return {doc["fullName"]: next(label["value"] for label in doc["labels"] if label["name"] == "feature")
            for doc in docs}


def test_the_reports_feature_is_the_marked_kind_whatever_the_file_is_called(pytester: pytest.Pytester) -> None:
    """The same module saved as ``test_ops.py`` and as ``test_renamed_ops.py`` lands in one feature; a test
    declaring no kind (not the suite's) keeps its module's name."""
    pytester.makepyfile(test_ops=OPS, test_renamed_ops=OPS, test_mine="def test_own():\n    pass\n")
    results = pytester.path / "allure-results"
    run = pytester.runpytest_subprocess("-p", "conformance.plugin", "-p", "no:cacheprovider", f"--alluredir={results}")
    run.assert_outcomes(passed=7)
    assert _features(results) == {  # a test's own marker over its module's; its name says nothing
        "test_ops#test_numerics": "op", "test_ops#test_w8a16_by_name": "op", "test_ops#test_quantised": "w8A16",
        "test_renamed_ops#test_numerics": "op", "test_renamed_ops#test_w8a16_by_name": "op",
        "test_renamed_ops#test_quantised": "w8A16", "test_mine#test_own": "mine"}


@pytest.mark.parametrize(("options", "kept"), [
    ((), {("test_other.py", "test_explore")}),
    (("--coc-explore", "1"), {("test_drawn_cases.py", "test_explore")}),
    (("--coc-replay", "spec.json"), {("test_drawn_cases.py", "test_replay")}),
])
def test_the_explorer_plugin_finds_its_tests_by_kind(pytester: pytest.Pytester, options: tuple[str, ...],
                                                     kept: set[tuple[str, str]]) -> None:
    """The explorer's tests, in a module of any name, are deselected in a plain run and alone kept (the one the
    option runs) with ``--coc-explore`` or ``--coc-replay``; a test of the same name declaring no explorer kind is
    an ordinary test."""
    pytester.makepyfile(test_drawn_cases=EXPLORER, test_other="def test_explore():\n    pass\n")
    shutil.copyfile(next((ROOT / "conformance" / "corpus").glob("*.json")), pytester.path / "spec.json")
    run = pytester.inline_run("-p", "conformance.plugin", "-p", "no:cacheprovider", "--collect-only", *options)
    items = run.getcall("pytest_collection_finish").session.items
    assert {(item.path.name, item.name) for item in items} == kept
