"""Case ids: how expectations files, the smoke tier, the summary and the gate name a case, its capability and
what it needs of the node.

A case id is the pytest node id without its directories
(``test_layers.py::test_x[params]``), so it is the same whether the suite ran
from a checkout or from an installed package (``--pyargs``).  Patterns use
``*`` and ``?`` as wildcards; brackets are literal (case ids are full of them).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
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


def on_ranks(item: pytest.Item) -> bool:
    """Whether the case runs on rank pools (it asks for the ``coc_ranks`` fixture): only such cases are leased,
    ordered by the world they need, broken by the storm breaker and started ahead."""
    return "coc_ranks" in getattr(item, "fixturenames", ())


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


@dataclass(frozen=True)
class Needs:
    """What a case needs of the node: the TP sizes it runs at, the ranks it starts at once, and whether it
    holds the whole node (a perf case: nothing else runs beside its timings)."""

    tps: frozenset[int]
    world: int
    exclusive: bool

    def shortfall(self, devices: int) -> str | None:
        """Why a node of ``devices`` devices (CPU slots) cannot run the case (None when it can)."""
        if self.world > devices:
            return f"needs {self.world} devices, this node has {devices}"
        return None


def needs(item: pytest.Item) -> Needs:
    """The one reading of a case's sizes (``docs/DESIGN.md#leases-and-node-size``): its TP parameters
    (``tp``, ``world_size``), the TP and world a parameter object carries (a perf profile case, a corpus spec;
    TP 0 is a case run in the test process), and ``world`` when its TP group is a proper subgroup.
    ``--coc-tp``, the node-size skip, the order of cases and the lease all read it."""
    from conformance.options import TP_PARAMS, WORLD_PARAM

    params: dict[str, Any] = getattr(getattr(item, "callspec", None), "params", {})
    tps = {params[p] for p in TP_PARAMS if isinstance(params.get(p), int) and not isinstance(params[p], bool)}
    carried = [v for v in params.values() if isinstance(getattr(v, "tp", None), int)]
    tps |= {v.tp for v in carried if v.tp > 0}  # 0: a case run in the test process forms no TP group
    worlds = [params.get(WORLD_PARAM), *(getattr(v, "world", None) for v in carried)]
    sizes = [*tps, *(w for w in worlds if isinstance(w, int) and not isinstance(w, bool))]
    return Needs(frozenset(tps), max(sizes, default=0), item.get_closest_marker("perf") is not None)
