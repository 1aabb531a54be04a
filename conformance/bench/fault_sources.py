"""A fault's source as the kept runs know it: its digest, and where the faults' sources are read from.

A fault's records stay valid while its source does (:func:`source_digest`):
its definition and every module-level class or function of the faults'
modules that it names, transitively.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

from conformance.bench.kill_runs import ROOT


def source_digest(sources: str | Sequence[str], name: str) -> str:
    """A digest of ``name``'s definition in the modules' ``sources`` (one module's, or those of a package's modules:
    :func:`module_sources`) and of every module-level class or function of them that ``name`` names, transitively
    (its bases, the helpers it calls, in whichever of the modules they are); what comes from elsewhere is not
    included."""
    defined: dict[str, list[ast.AST]] = {}
    for source in [sources] if isinstance(sources, str) else sources:
        for node in ast.parse(source).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.setdefault(node.name, []).append(node)
    seen: list[str] = []
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in defined:
            continue
        seen.append(current)
        todo += sorted({n.id for part in defined[current] for n in ast.walk(part) if isinstance(n, ast.Name)})
    digest = hashlib.sha256(name.encode())
    for part in sorted(seen):
        for definition in defined[part]:
            digest.update(ast.dump(definition).encode())
    return digest.hexdigest()[:16]


def faults_module(name: str) -> Any:
    """The module of the faults (importable from the checkout)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


def module_sources(module: Any) -> list[str]:
    """The source of ``module`` and, for a package, of each module under it (where a fault's helpers may be)."""
    sources = [inspect.getsource(module)]
    for info in pkgutil.walk_packages(getattr(module, "__path__", ()), module.__name__ + "."):
        sources.append(inspect.getsource(importlib.import_module(info.name)))
    return sources
