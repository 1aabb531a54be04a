"""The megatron-core releases the harness supports, checked without importing megatron.

``pyproject.toml`` states the same range; outside it the suite stops at
start-up naming the installed version, instead of failing deep inside a case.
"""

from __future__ import annotations

import importlib.metadata
import re

#: Every minor release from 0.7 to 0.16 (the newest on the registry when checked).
SUPPORTED = ">=0.7,<0.17"
_LOW, _HIGH = (0, 7), (0, 17)


class UnsupportedMegatron(RuntimeError):
    """The installed megatron-core is outside :data:`SUPPORTED`."""


def installed() -> str | None:
    """The installed megatron-core version, or None."""
    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return None


def check() -> str | None:
    """The installed version if supported (None if not installed); else :class:`UnsupportedMegatron`."""
    version = installed()
    if version is None:
        return None
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or not _LOW <= (int(found[1]), int(found[2])) < _HIGH:
        raise UnsupportedMegatron(
            f"megatron-core {version} is installed; coc-conformance supports megatron-core {SUPPORTED} "
            f"(pip install 'megatron-core{SUPPORTED}' --no-deps)")
    return version
