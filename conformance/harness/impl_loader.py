"""Resolve ``--coc-impl module:attr`` to an implementation object.

The attribute may be the object itself, a class, or any zero-argument callable
returning one.  Ranks resolve the same spec string in their own process, so an
implementation never has to be picklable.  Every way this can go wrong -- no
such module, an import error *inside* the implementation, an exception while
importing or constructing it, an object that is not an implementation -- is an
:class:`ImplementationLoadError` that says which.
"""

from __future__ import annotations

import importlib
import inspect
from functools import cache
from typing import Any

from conformance.options import IMPL

__all__ = ["ImplementationLoadError", "accepts_keyword", "code_digest", "load_implementation", "missing_capability",
           "preload_implementation"]


class ImplementationLoadError(ImportError):
    """``--coc-impl`` does not name a usable implementation."""


@cache
def load_implementation(spec: str) -> Any:
    """Import ``module:attr`` and return the implementation (cached per process)."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ImplementationLoadError(f"{IMPL} {spec!r}: expected 'module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ImplementationLoadError(f"{IMPL} {spec!r}: no module named {exc.name!r} "
                                          "(is it installed, or on PYTHONPATH?)") from exc
        raise ImplementationLoadError(f"{IMPL} {spec!r}: importing {module_name!r} failed because a module "
                                      f"it needs is missing: {exc}") from exc
    except ImportError as exc:
        raise ImplementationLoadError(f"{IMPL} {spec!r}: importing {module_name!r} failed inside the "
                                      f"implementation: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any error at import is a load error, named as such
        raise ImplementationLoadError(f"{IMPL} {spec!r}: importing {module_name!r} raised "
                                      f"{type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImplementationLoadError(f"{IMPL} {spec!r}: {module_name!r} has no {attr_path!r}") from None
    if callable(target) and not _looks_like_impl(target):
        try:
            impl = target()
        except Exception as exc:  # noqa: BLE001
            raise ImplementationLoadError(f"{IMPL} {spec!r}: calling {attr_path!r} to make the implementation "
                                          f"raised {type(exc).__name__}: {exc}") from exc
    else:
        impl = target
    if not _looks_like_impl(impl):
        raise ImplementationLoadError(
            f"{IMPL} {spec!r}: {impl!r} lacks 'name' and 'configure' (see conformance.protocol)"
        )
    return impl


def preload_implementation(spec: str) -> None:
    """Load the implementation on a rank before a task's budget starts (``docs/DESIGN.md#time-budget``).

    A failure is left for the task to meet (``RankContext.impl`` raises it
    again, as that rank's error), so a task that never touches the
    implementation is not failed by it.
    """
    try:
        load_implementation(spec)
    except ImplementationLoadError:
        pass


@cache
def code_digest(spec: str) -> str:
    """A digest of the implementation's code: every Python file of the top-level package its module is in (or the
    module's file alone).  What a deterministic result depends on besides its inputs: another digest, other code,
    whose bits may legitimately differ."""
    import hashlib
    from pathlib import Path

    module = importlib.import_module(spec.partition(":")[0].split(".")[0])
    roots = [Path(p) for p in getattr(module, "__path__", ())] or [Path(str(module.__file__))]
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _looks_like_impl(obj: Any) -> bool:
    return not isinstance(obj, type) and isinstance(getattr(obj, "name", None), str) and callable(
        getattr(obj, "configure", None)
    )


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes the keyword argument ``name`` (by name, or through ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def missing_capability(impl: Any, capability: str) -> str | None:
    """Why ``impl`` cannot do ``capability`` (None when it can)."""
    if not callable(getattr(impl, capability, None)):
        return f"{impl.name} does not implement {capability}"
    return None
