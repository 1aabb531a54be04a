"""Where MindSpeed is and which of its versions it is: the checkout ``MINDSPEED_SRC`` names, its branch and commit.

The branch and commit decide which expectations apply and which MindSpeed
API the adapter meets; they are read from the checkout's git metadata (a
worktree, a clone or a plain ``.git`` directory), never assumed.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Environment variable naming the MindSpeed checkout (its root, holding ``mindspeed/``).
CHECKOUT_ENV = "MINDSPEED_SRC"
#: The package of the feature-manager CoC, which a usable checkout has.
COC_PACKAGE = Path("mindspeed", "core", "tensor_parallel", "coc_feature")
#: How to get a checkout (said by every refusal).
HOW = (f"point {CHECKOUT_ENV} at a MindSpeed checkout with the feature-manager CoC, e.g. `git clone -b "
       f"core_r0.16.0 https://github.com/Ascend/MindSpeed && export {CHECKOUT_ENV}=$PWD/MindSpeed` "
       "(branches 2.1.0_core_r0.12.1 to core_r0.18.0 and master, each on the megatron-core it targets)")


@dataclass(frozen=True)
class Checkout:
    """A MindSpeed checkout: its root, and the branch and commit git says it is at ("" where unknown)."""

    root: Path
    branch: str = ""
    commit: str = ""

    def describe(self) -> str:
        where = " @ ".join(filter(None, [self.branch or "branch unknown", self.commit[:8]]))
        return f"MindSpeed at {self.root} ({where})"


def checkout() -> Path:
    """The MindSpeed checkout ``MINDSPEED_SRC`` names; an ImportError saying how to set it otherwise."""
    raw = os.environ.get(CHECKOUT_ENV)
    if not raw:
        raise ImportError(f"MindSpeed is not available: {CHECKOUT_ENV} is not set; {HOW}")
    root = Path(raw).expanduser().resolve()
    if not (root / COC_PACKAGE).is_dir():
        raise ImportError(f"MindSpeed is not available: {CHECKOUT_ENV}={raw} has no {COC_PACKAGE} "
                          f"(not a MindSpeed checkout with the feature-manager CoC); {HOW}")
    return root


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def identify(root: Path) -> Checkout:
    """``root``'s branch and commit as git reports them (empty where it is not a git checkout or git is absent).

    A detached checkout (CI checks out commits) is named by the branches that
    contain its commit, the first of them sorted.
    """
    commit = _git(root, "rev-parse", "HEAD")
    branch = _git(root, "symbolic-ref", "--short", "-q", "HEAD")
    if commit and not branch:
        listed = _git(root, "branch", "--all", "--format=%(refname:short)", "--contains", commit).splitlines()
        containing = [name for name in listed if name and not name.startswith("(")]  # not "(HEAD detached …)"
        branch = sorted(name.rpartition("/")[2] for name in containing)[0] if containing else ""
    return Checkout(root, branch, commit)
