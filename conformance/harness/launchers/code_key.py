"""Which code ranks run: a digest of the project's packages, so that a rank server shared between sessions never
runs a session's cases on code other than its own.

Ranks import the suite's harness, cases and golden data (and megatron-core
through ``coc_shared``) in their fork server, once: a session whose files
differ from the server's would be judged by stale code.  A session therefore
uses another session's rank server (``--coc-rank-server``) only where both
digests agree: the same interpreter, and the same bytes in every file of
:data:`PACKAGES` (``docs/DESIGN.md#rank-server``).  The implementation's own
modules are imported by each pool's ranks after the fork, from the files as
they are then.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

#: The project's packages (the distribution's, ``pyproject.toml``): what the fork server and the server import.
PACKAGES = ("conformance", "coc_impl", "coc_shared", "golden")
#: Folders within them that hold no code the ranks run (bytecode, the report's npm install).
_SKIPPED = {"__pycache__", "node_modules"}


def code_key(packages: tuple[str, ...] = PACKAGES) -> str:
    """A digest of this interpreter and of every file (its path in the package, and its bytes) of ``packages``."""
    digest = hashlib.sha256(sys.executable.encode())
    for name in packages:
        spec = importlib.util.find_spec(name)
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            base = Path(root)
            for relative in sorted(_files(base)):
                digest.update(f"\0{name}/{relative.as_posix()}\0".encode())
                digest.update((base / relative).read_bytes())
    return digest.hexdigest()


def _files(base: Path) -> list[Path]:
    """Every file under ``base``, relative to it, without descending into :data:`_SKIPPED` folders (the report's
    npm install alone holds some 9,000 paths)."""
    found: list[Path] = []
    for folder, subfolders, names in os.walk(base):
        subfolders[:] = [d for d in subfolders if d not in _SKIPPED]
        found.extend(Path(folder, n).relative_to(base) for n in names)
    return found
