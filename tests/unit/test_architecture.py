"""The house rules of docs/DESIGN.md#house, enforced on the source.

* ``coc_impl`` (the reference) never imports ``conformance`` (its judge);
* ``conformance`` reaches ``coc_impl`` only as the default implementation's
  name (``conformance.options.DEFAULT_IMPL``), never by import;
* ``coc_shared`` (neutral ground) imports neither; ``golden`` imports neither;
* one module owns each foreign dependency: megatron-core
  (the package ``coc_shared.megatron``), allure (the package ``conformance.reporting.allure``),
  torch_npu (``coc_impl.backends.npu_runtime``; device detection only probes for it);
* inside ``conformance``, data flows one way (test -> rank task -> typed
  results -> checks -> record -> report): :data:`SUB_FORBIDDEN` lists what each part
  must not import: the contract stands alone (no harness), the record of a verdict is
  a floor below the judge, the plugins, the gate and the report, and those last three
  read the record, never the judge;
* no import cycle between files, nor between folders; a module of a package
  whose ``__init__`` imports its modules never imports through that package
  (``from package import name``: the ``__init__`` is half-run when it does);
* no two modules share a basename (one name per concept), packages' ``__init__`` aside.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support import ROOT

PACKAGES = ("coc_impl", "coc_shared", "conformance", "golden")

#: package -> top-level packages of this project it must not import
FORBIDDEN = {
    "coc_impl": {"conformance"},
    "coc_shared": {"conformance", "coc_impl"},
    "golden": {"conformance", "coc_impl"},
    "conformance": {"coc_impl"},
}
#: part of ``conformance`` -> the parts it must not import (the direction of the data flow).
SUB_FORBIDDEN = {
    "conformance.contract": {"harness", "record", "cases", "judge", "explore", "suite", "plugins", "reporting",
                             "gating", "bench"},
    "conformance.harness": {"record", "cases", "judge", "explore", "suite", "plugins", "reporting", "gating",
                            "bench"},
    "conformance.record": {"cases", "judge", "explore", "suite", "plugins", "reporting", "gating", "bench"},
    "conformance.cases": {"record", "judge", "explore", "suite", "plugins", "reporting", "gating", "bench"},
    "conformance.judge": {"cases", "explore", "suite", "plugins", "reporting", "gating", "bench"},
    "conformance.explore": {"suite", "plugins", "reporting", "gating", "bench"},
    "conformance.suite": {"plugins", "reporting", "gating", "bench"},
    "conformance.gating": {"cases", "judge", "explore", "suite", "plugins", "reporting", "bench"},
    "conformance.reporting": {"cases", "judge", "explore", "suite", "plugins", "gating", "bench"},
    "conformance.plugins": {"cases", "judge", "suite", "bench"},
    "conformance.adapters": {"harness", "contract", "record", "cases", "judge", "explore", "suite", "plugins",
                             "reporting", "gating", "bench"},
}

#: foreign package -> the modules (or, ending in ``/``, the folders) allowed to import it
OWNERS = {
    "megatron": {"coc_shared/megatron/", "conformance/adapters/mindspeed/shims.py",
                 "conformance/adapters/mindspeed/layer_patch.py", "conformance/adapters/mindspeed/compat.py"},
    "allure": {"conformance/reporting/allure/"},
    "torch_npu": {"coc_impl/backends/npu_runtime.py", "conformance/harness/launchers/devices.py"},
}


#: ``coc_impl.<module>`` (not the ``coc_impl`` fixture's ``.name`` / ``.configure``).
MODULE_REFERENCE = r"\bcoc_impl\.(?!name\b|configure\b)[a-z_]+"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module a source file imports, anywhere in it (function-local imports too).

    ``from package import name`` counts as an import of ``package.name`` when
    that is a module of this project, else of ``package``.
    """
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return found


def sources() -> list[tuple[str, Path]]:
    return [(package, path) for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


MODULES = {module_name(path): path for _, path in sources()}


def project_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph[name] = {m for m in imports(path) if m in MODULES and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def folder(module: str) -> str:
    """The package (folder) a module lives in; a package's ``__init__`` belongs to its own folder."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Folder -> folders it imports from, a folder's own subfolders and parents left out."""
    folders: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        here = folder(module)
        for target in targets:
            there = folder(target)
            nested = there.startswith(here + ".") or here.startswith(there + ".")
            if there != here and not nested:
                folders[here].add(there)
    return folders


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


@pytest.mark.parametrize("part", sorted(SUB_FORBIDDEN))
def test_data_flows_one_way_inside_conformance(part: str) -> None:
    banned = {f"conformance.{name}" for name in SUB_FORBIDDEN[part]}
    offenders = {}
    for module, path in MODULES.items():
        if module == part or module.startswith(part + "."):
            bad = {m for m in imports(path) if any(m == b or m.startswith(b + ".") for b in banned)}
            if bad:
                offenders[module] = sorted(bad)
    assert not offenders, f"{part} imports against the flow: {offenders}"


def test_no_import_cycle_between_files() -> None:
    assert cycles(project_graph()) == []


def test_no_import_cycle_between_folders() -> None:
    found = cycles(folder_graph(project_graph()))
    assert found == [], found


def own_package_imports(path: Path) -> list[str]:
    """The ``from <own package> import ...`` / ``import <own package>`` of a module (not an ``__init__``)."""
    if path.name == "__init__.py":
        return []
    package = module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module == package and not node.level
                                                 or node.level == 1 and not node.module):
            found.append(f"from {package} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found.extend(f"import {a.name}" for a in node.names if a.name == package)
    return found


def reached_within(graph: dict[str, set[str]], package: str) -> set[str]:
    """The modules of ``package`` its ``__init__`` imports, directly or through others of them."""
    if package not in MODULES or MODULES[package].name != "__init__.py":
        return set()
    seen: set[str] = set()
    todo = [package]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target.rpartition(".")[0] == package and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_no_module_imports_through_a_package_that_imports_it() -> None:
    """A package's ``__init__`` that imports its modules is half-run when they import through it: a loop."""
    graph, offenders = project_graph(), {}
    for name, path in MODULES.items():
        package = name.rpartition(".")[0]
        if name not in reached_within(graph, package) or not (found := own_package_imports(path)):
            continue
        offenders[name] = found
    assert not offenders, f"modules import through the package that imports them: {offenders}"


def _basenames(paths: Iterable[Path]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        if path.name not in ("__init__.py", "__main__.py", "conftest.py"):
            seen[path.name].append(str(path.relative_to(ROOT)))
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_one_module_per_basename() -> None:
    assert _basenames(path for _, path in sources()) == {}


def test_the_checks_see_cycles_and_one_way_breaches() -> None:
    """The helpers above find what they look for (a test of the test)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("dependency", sorted(OWNERS))
def test_one_module_owns_each_foreign_dependency(dependency: str) -> None:
    users = {str(path.relative_to(ROOT)) for _, path in sources()
             if any(m.split(".")[0] == dependency for m in imports(path))}
    outside = sorted(user for user in users if not any(
        user == owner or owner.endswith("/") and user.startswith(owner) for owner in OWNERS[dependency]))
    assert not outside, f"{dependency} is imported outside its owner: {outside}"


def test_conformance_names_the_reference_only_as_the_default() -> None:
    mentions = {str(path.relative_to(ROOT)) for package, path in sources() if package == "conformance"
                and re.search(MODULE_REFERENCE, path.read_text(encoding="utf-8"))}
    assert mentions == {"conformance/options.py"}, mentions
