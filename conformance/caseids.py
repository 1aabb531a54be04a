"""Case ids: how expectations files, the smoke tier, the summary and the gate name a case.

A case id is the pytest node id without its directories
(``test_layers.py::test_x[params]``), so it is the same whether the suite ran
from a checkout or from an installed package (``--pyargs``).  Patterns use
``*`` and ``?`` as wildcards; brackets are literal (case ids are full of them).
"""

from __future__ import annotations

import fnmatch


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
