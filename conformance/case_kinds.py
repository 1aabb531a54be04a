"""The kind of a case (op, layer, training, config, perf, explore, corpus): its ``coc_kind`` marker.

The report's feature and the explorer's plugin find a case by what it
declares, never by the file it lives in: a suite module states its kind once
(``pytestmark = pytest.mark.coc_kind("op")``), so renaming or moving it
changes nothing downstream.  Imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

#: The marker a suite module (or a test) names its kind with.
KIND_MARKER = "coc_kind"
#: The kinds of the suite's modules, and of its w8A16 tests (marked each, in the op module).
OP, LAYER, TRAINING, CONFIG, PERF, EXPLORE, CORPUS = "op", "layer", "training", "config", "perf", "explore", "corpus"
W8A16 = "w8A16"


def declared_kind(item: pytest.Item) -> str | None:
    """The kind the case's ``coc_kind`` marker names (the closest one), or None."""
    mark = item.get_closest_marker(KIND_MARKER)
    return str(mark.args[0]) if mark is not None and mark.args else None


def kind_of(item: pytest.Item) -> str:
    """The case's kind as the report groups it: its marker's (a test's own before its module's); a test that
    declares none (not one of the suite's) goes by its module's name."""
    module = getattr(getattr(item, "module", None), "__name__", item.path.stem).rsplit(".", 1)[-1]
    return declared_kind(item) or module.removeprefix("test_").replace("_", " ")
