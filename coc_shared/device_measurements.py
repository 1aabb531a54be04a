"""The device check's measurements as its users read them: one key of its JSON, from the file a variable names.

``python -m conformance.bench device`` writes one JSON; each measurement the
rest of the tree reads is one key of it (``chunk_efficiency``, ``gemm_rows``)
and reaches the ranks as well as the pytest process through an environment
variable naming the file (``COC_CHUNK_EFFICIENCY``, ``COC_GEMM_ROWS``).  A file
holding the measurement alone is read too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from coc_shared.json_file import read_json

Measured = TypeVar("Measured")


def section(path: str | Path, key: str, error: Callable[[str], Exception]) -> Mapping[str, Any]:
    """The ``key`` of the JSON at ``path`` (the whole document where it has no such key); ``error`` names the file
    when it cannot be read."""
    doc = read_json(path, error, f"{key} from")
    if not isinstance(doc, Mapping):
        raise error(f"{path}: not a JSON object")
    found = doc.get(key, doc)
    return found if isinstance(found, Mapping) else {}


@cache
def _read_once(load: Callable[[str], Any], path: str) -> Any:
    return load(path)


def configured(variable: str, load: Callable[[str], Measured]) -> Measured | None:
    """What ``load`` reads from the file ``variable`` names, if set (read once per process and path)."""
    path = os.environ.get(variable)
    return _read_once(load, path) if path else None
