"""The megatron-core releases the harness supports, checked without importing megatron.

``pyproject.toml`` states the same range; outside it the suite stops at
start-up naming the installed version, instead of failing deep inside a case.
So it does when a release's undeclared import-time needs are missing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

#: Every minor release from 0.7 to 0.19 (the newest on the registry when checked).
SUPPORTED = ">=0.7,<0.20"
_LOW, _HIGH = (0, 7), (0, 20)
#: Modules ``import megatron.core`` needs from a release on that its metadata does not declare:
#: 0.18 imports triton (MoE paged stash, reached from ``megatron.core.distributed``).
_UNDECLARED = {(0, 18): ("triton",)}


class UnsupportedMegatron(RuntimeError):
    """The installed megatron-core is outside :data:`SUPPORTED`, or cannot be imported as installed."""


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
    release = (int(found[1]), int(found[2])) if found else None
    if release is None or not _LOW <= release < _HIGH:
        raise UnsupportedMegatron(
            f"megatron-core {version} is installed; coc-conformance supports megatron-core {SUPPORTED} "
            f"(pip install 'megatron-core{SUPPORTED}' --no-deps)")
    missing = [name for since, names in _UNDECLARED.items() if release >= since for name in names
               if importlib.util.find_spec(name) is None]
    if missing:
        raise UnsupportedMegatron(
            f"megatron-core {version} imports {', '.join(missing)} when megatron.core is imported, "
            f"without declaring it, and it is not installed: pip install {' '.join(missing)}")
    return version
