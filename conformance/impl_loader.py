"""Resolve ``--coc-impl module:attr`` to an implementation object.

The attribute may be the object itself, a class, or any zero-argument callable
returning one.  Ranks resolve the same spec string in their own process, so an
implementation never has to be picklable.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

DEFAULT_IMPL = "coc_impl.reference:ReferenceCoC"


class ImplementationLoadError(ImportError):
    """``--coc-impl`` does not name a usable implementation."""


@cache
def load_implementation(spec: str) -> Any:
    """Import ``module:attr`` and return the implementation (cached per process)."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ImplementationLoadError(f"--coc-impl {spec!r}: expected 'module:attr'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImplementationLoadError(f"--coc-impl {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImplementationLoadError(f"--coc-impl {spec!r}: {module_name!r} has no {attr_path!r}") from None
    impl = target() if callable(target) and not _looks_like_impl(target) else target
    if not _looks_like_impl(impl):
        raise ImplementationLoadError(
            f"--coc-impl {spec!r}: {impl!r} lacks 'name' and 'configure' (see conformance.protocol)"
        )
    return impl


def _looks_like_impl(obj: Any) -> bool:
    return not isinstance(obj, type) and isinstance(getattr(obj, "name", None), str) and callable(
        getattr(obj, "configure", None)
    )


def missing_capability(impl: Any, capability: str) -> str | None:
    """Why ``impl`` cannot do ``capability`` (None when it can)."""
    if not callable(getattr(impl, capability, None)):
        return f"{impl.name} does not implement {capability}"
    return None
