"""Importing MindSpeed's CoC from the checkout, finding what this branch offers rather than assuming it.

Branches differ in where things live: ``2.1.0_core_r0.12.1`` builds its
feature list only when asked (``create_features_list``) and has no
``mindspeed.args_utils``; ``core_r0.17.0`` and later import a top-level
``megatron_adaptor`` from ``mindspeed/__init__.py``.  What is found is
recorded in :class:`MindSpeed`; what is missing is named for what it is: a
dependency the branch imports (installable, or stood in for by the user's
opt-in ``MINDSPEED_STAND_IN``) or a module the checkout lacks (not a branch
with the feature-manager CoC).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conformance.adapters.mindspeed.checkout import CHECKOUT_ENV, HOW, Checkout, checkout, identify
from conformance.adapters.mindspeed.shims import install_cpu_shims

#: Comma-separated modules the user lets the adapter stand in for with empty ones (e.g. ``megatron_adaptor``,
#: which ``mindspeed/__init__.py`` imports on core_r0.17.0+ to patch all of Megatron-LM at import: the adapter
#: patches megatron's two layers itself, so nothing of it is needed here).
STAND_IN_ENV = "MINDSPEED_STAND_IN"
_COC = "mindspeed.core.tensor_parallel.coc_feature"


@dataclass(frozen=True)
class MindSpeed:
    """Handles on the MindSpeed modules the adapter drives (imported from the checkout)."""

    checkout: Checkout
    features: tuple[Any, ...]  #: MindSpeed's feature objects, in its order
    #: ``mindspeed.args_utils.parser_unknown_args`` (dict in, dict out); None where the branch keeps it in
    #: its import-time adaptor (2.1.0), which cannot load here: unknown flags are then dropped.
    parser_unknown_args: Callable[..., dict[str, Any]] | None
    user_config: Any  #: coc_feature.user_config (its _COC_CFGS dict)
    min_comm: Any  #: coc_feature.min_comm_cfg (MinCommConfig and the global min_comm_config)
    column_impl: Any
    row_impl: Any

    @property
    def root(self) -> Any:
        return self.checkout.root


def stand_ins() -> tuple[str, ...]:
    """The modules ``MINDSPEED_STAND_IN`` lets the adapter stand in for."""
    return tuple(name.strip() for name in os.environ.get(STAND_IN_ENV, "").split(",") if name.strip())


def missing_module_error(found: Checkout, exc: ModuleNotFoundError) -> ImportError:
    """``exc`` (raised importing MindSpeed) as a refusal that says what is missing and what to do."""
    name = exc.name or "?"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(found.root))]
    where = f" (imported by {frames[-1].filename.removeprefix(str(found.root) + os.sep)}:{frames[-1].lineno})" \
        if frames else ""
    if name.partition(".")[0] != "mindspeed":
        return ImportError(
            f"{found.describe()} needs module {name!r}{where}, which is not installed: a missing dependency "
            f"of this branch, not a wrong branch.  Install it, or let the adapter stand in an empty module: "
            f"{STAND_IN_ENV}={name} (only for modules MindSpeed's CoC does not call)")
    return ImportError(f"{found.describe()} has no module {name!r}{where}: not a branch whose feature-manager "
                       f"CoC the adapter drives; {HOW}")


def feature_list(features_manager: Any) -> tuple[Any, ...]:
    """MindSpeed's features, fresh where the branch builds them on request, else the manager's list."""
    create = getattr(features_manager, "create_features_list", None)
    return tuple(create() if callable(create) else features_manager.MindSpeedFeaturesManager.FEATURES_LIST)


@functools.cache
def load_mindspeed() -> MindSpeed:
    """Import MindSpeed's CoC from the checkout, with the CPU shims; once per process."""
    found = identify(checkout())
    if str(found.root) not in sys.path:
        sys.path.insert(0, str(found.root))
    install_cpu_shims(stand_ins())
    try:
        features_manager = importlib.import_module("mindspeed.features_manager")
        user_config = importlib.import_module(f"{_COC}.user_config")
        min_comm = importlib.import_module(f"{_COC}.min_comm_cfg")
        column = importlib.import_module(f"{_COC}.coc_column_parallel_linear").CoCColumnParallelLinearImpl
        row = importlib.import_module(f"{_COC}.coc_row_parallel_linear").CoCRowParallelLinearImpl
    except ModuleNotFoundError as exc:
        raise missing_module_error(found, exc) from exc
    except ImportError as exc:
        raise ImportError(f"{found.describe()} cannot be imported ({exc}); {HOW}") from exc
    try:
        parser_unknown_args = importlib.import_module("mindspeed.args_utils").parser_unknown_args
    except (ImportError, AttributeError):
        parser_unknown_args = None
    return MindSpeed(found, feature_list(features_manager), parser_unknown_args, user_config, min_comm, column, row)


__all__ = ["CHECKOUT_ENV", "STAND_IN_ENV", "MindSpeed", "load_mindspeed", "missing_module_error", "stand_ins"]
