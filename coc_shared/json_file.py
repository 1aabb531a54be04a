"""Reading a JSON file the user named: one reader, whose error names the file and what it was read for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_json(path: str | Path, error: Callable[[str], Exception], what: str = "") -> Any:
    """The JSON document at ``path``; ``error`` (raised from nothing else) says ``cannot read <what> <path>: why``
    when it cannot be read or parsed."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise error(f"cannot read {what + ' ' if what else ''}{path}: {exc}") from None
