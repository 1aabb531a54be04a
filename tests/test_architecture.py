"""The house rules of docs/DESIGN.md#house, enforced on the source.

* ``coc_impl`` (the reference) never imports ``conformance`` (its judge);
* ``conformance`` reaches ``coc_impl`` only as the default implementation's
  name (``conformance.options.DEFAULT_IMPL``), never by import;
* ``coc_shared`` (neutral ground) imports neither; ``golden`` imports neither;
* one module owns each foreign dependency: megatron-core
  (``coc_shared.megatron_harness``), allure (``conformance.reporting.allure``),
  torch_npu (``coc_impl.backends.ascend``; device detection only probes for it).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("coc_impl", "coc_shared", "conformance", "golden")

#: package -> top-level packages of this project it must not import
FORBIDDEN = {
    "coc_impl": {"conformance"},
    "coc_shared": {"conformance", "coc_impl"},
    "golden": {"conformance", "coc_impl"},
    "conformance": {"coc_impl"},
}
#: foreign package -> the modules allowed to import it
OWNERS = {
    "megatron": {"coc_shared/megatron_harness.py", "conformance/adapters/mindspeed.py"},
    "allure": {"conformance/reporting/allure.py"},
    "torch_npu": {"coc_impl/backends/ascend.py", "conformance/harness/launchers/devices.py"},
}


#: ``coc_impl.<module>`` (not the ``coc_impl`` fixture's ``.name`` / ``.configure``).
MODULE_REFERENCE = r"\bcoc_impl\.(?!name\b|configure\b)[a-z_]+"


def imports(path: Path) -> set[str]:
    """Every module a source file imports, anywhere in it (function-local imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def sources() -> list[tuple[str, Path]]:
    return [(package, path) for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_forbidden_imports(package: str) -> None:
    offenders = {}
    for owner, path in sources():
        if owner != package:
            continue
        bad = {m for m in imports(path) if m.split(".")[0] in FORBIDDEN.get(package, set())}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"{package} imports what it must not: {offenders}"


@pytest.mark.parametrize("dependency", sorted(OWNERS))
def test_one_module_owns_each_foreign_dependency(dependency: str) -> None:
    users = {str(path.relative_to(ROOT)) for _, path in sources()
             if any(m.split(".")[0] == dependency for m in imports(path))}
    outside = sorted(users - OWNERS[dependency])
    assert not outside, f"{dependency} is imported outside its owner: {outside}"


def test_conformance_names_the_reference_only_as_the_default() -> None:
    mentions = {str(path.relative_to(ROOT)) for package, path in sources() if package == "conformance"
                and re.search(MODULE_REFERENCE, path.read_text(encoding="utf-8"))}
    assert mentions == {"conformance/options.py"}, mentions
