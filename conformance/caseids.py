"""Case ids: how expectations files, the smoke tier, the summary and the gate name a case, and its capability.

A case id is the pytest node id without its directories
(``test_layers.py::test_x[params]``), so it is the same whether the suite ran
from a checkout or from an installed package (``--pyargs``).  Patterns use
``*`` and ``?`` as wildcards; brackets are literal (case ids are full of them).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest


#: The suite's own test modules live here, in a checkout and in an installed package alike.
SUITE_DIR = Path(__file__).resolve().parent / "suite"


def in_suite(path: Path | str) -> bool:
    """Whether a test file is one of the suite's (by its place: an installed suite's node ids
    are relative to its own directory, so they name no ``suite/``)."""
    return Path(path).resolve().parent == SUITE_DIR


def case_id(nodeid: str) -> str:
    """The node id without its directories."""
    path, sep, rest = nodeid.partition("::")
    return path.rsplit("/", 1)[-1] + sep + rest


def area(nodeid: str) -> str:
    """The suite area a case belongs to: its module without ``test_`` (``layers``, ``ops`` ...)."""
    return case_id(nodeid).split("::", 1)[0].removeprefix("test_").removesuffix(".py")


def matches(case: str, pattern: str) -> bool:
    """Whether ``case`` matches ``pattern`` (``*`` and ``?`` wildcards, literal brackets)."""
    return fnmatch.fnmatchcase(case, pattern.replace("[", "[[]"))


def capability(item: pytest.Item) -> str | None:
    """The op or layer kind a case exercises (marker ``coc_capability``, else its parameters)."""
    mark = item.get_closest_marker("coc_capability")
    if mark is not None:
        return str(mark.args[0])
    params: dict[str, Any] = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("op"), str):
        return f"op:{params['op']}"
    if isinstance(params.get("layer"), str):
        return f"layer:{params['layer']}"
    golden_id = params.get("case_id")
    if isinstance(golden_id, str) and golden_id.startswith("layer-"):
        return f"layer:{golden_id.split('-')[1]}"
    return None
