"""Every kind of case the explorer draws, and a spec read back from JSON by its kind.

A new kind of case is one module of ``conformance/explore/`` and one line of
:data:`KINDS`.
"""

from __future__ import annotations

from typing import Any

from conformance.explore import config_settings, layer_training, op_calls, quant_calls
from conformance.explore.kind import Kind
from conformance.explore.spec import Spec, SpecError

#: The kinds of case, in the order a report lists them.
KINDS: tuple[Kind, ...] = (
    op_calls.KIND,
    layer_training.KIND,
    config_settings.KIND,
    quant_calls.KIND,
)


def kind_named(name: str) -> Kind:
    """The kind called ``name`` (a spec's ``kind``)."""
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise SpecError(f"unknown spec kind {name!r}; known: {', '.join(k.name for k in KINDS)}")


def kind_of(spec: Spec) -> Kind:
    """The kind ``spec`` is a case of."""
    return kind_named(spec.as_dict()["kind"])


def spec_from_dict(data: dict[str, Any]) -> Spec:
    """The spec of a ``Spec.as_dict`` (of any kind), checked runnable."""
    if not isinstance(data, dict) or "kind" not in data:
        raise SpecError("malformed spec: it names no kind")
    return kind_named(data["kind"]).from_dict(data)
