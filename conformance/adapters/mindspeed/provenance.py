"""Which shipped expectations file fits the checkout, and whether it was written for this very commit.

Each ``mindspeed*.expectations.toml`` beside this package says in its
``[meta]`` the branch, commit and megatron-core release it was written from
(some MindSpeed defects depend on the megatron-core it runs on).  A run on
another commit, or a branch or release no file was written for, is told so:
its known outcomes may no longer be the ones listed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from conformance.adapters.mindspeed.checkout import Checkout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: Where the shipped expectations files are (beside the package).
EXPECTATIONS_DIR = Path(__file__).resolve().parent.parent
PATTERN = "mindspeed*.expectations.toml"


@dataclass(frozen=True)
class WrittenFor:
    """What one expectations file was written from."""

    path: Path
    branch: str
    commit: str
    megatron_core: str  #: a release prefix, e.g. "0.16"

    def fits(self, branch: str, megatron_core: str) -> bool:
        return self.branch == branch and release_matches(megatron_core, self.megatron_core)


def release_matches(installed: str, prefix: str) -> bool:
    """Whether ``installed`` (``0.16.1``) is the release ``prefix`` names (``0.16``, ``0.16.1``)."""
    return installed == prefix or installed.startswith(prefix + ".")


def shipped(directory: Path = EXPECTATIONS_DIR) -> list[WrittenFor]:
    """Every expectations file in ``directory`` whose ``[meta]`` names a branch (unreadable files are skipped)."""
    found = []
    for path in sorted(directory.glob(PATTERN)):
        try:
            meta = tomllib.loads(path.read_text(encoding="utf-8")).get("meta", {})
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if meta.get("branch"):
            found.append(WrittenFor(path, str(meta["branch"]), str(meta.get("commit", "")),
                                    str(meta.get("megatron_core", ""))))
    return found


def installed_megatron_core() -> str:
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return "?"


def notes(found: Checkout, megatron_core: str, files: list[WrittenFor]) -> list[str]:
    """What a run should be told about its expectations: nothing when a file was written for exactly this."""
    fitting = [f for f in files if f.fits(found.branch, megatron_core)]
    if not fitting:
        written = ", ".join(f"{f.branch} on megatron-core {f.megatron_core} ({f.path.name})" for f in files)
        return [f"{found.describe()} on megatron-core {megatron_core}: no shipped expectations were written for "
                f"this branch and release (there are: {written or 'none'}); known outcomes are not on record"]
    best = fitting[0]
    if found.commit and best.commit and not found.commit.startswith(best.commit):
        return [f"{found.describe()}: its expectations ({best.path.name}) were written for commit "
                f"{best.commit[:8]}, not this one; outcomes may have changed since"]
    if not found.commit:
        return [f"{found.describe()}: the commit is unknown (not a git checkout); {best.path.name} was written "
                f"for {best.commit[:8]}"]
    return []
