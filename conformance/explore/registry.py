"""Every kind of case the explorer draws, and a spec read back from JSON by its kind.

A new kind of case is one module of ``conformance/explore/`` and one line of
:data:`KINDS`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conformance.explore import config_settings, layer_training, op_calls, quant_calls
from conformance.explore.kind import Kind
from conformance.explore.spec import SPEC_SCHEMA, Spec, SpecError

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


def load_finding(path: Path) -> tuple[Spec, dict[str, Any]]:
    """The spec of a finding file written by the explorer, and the whole document."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: not a spec file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SPEC_SCHEMA or "spec" not in doc:
        raise SpecError(f"{path}: not a spec of schema {SPEC_SCHEMA}")
    return spec_from_dict(doc["spec"]), doc
