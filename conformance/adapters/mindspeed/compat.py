"""Opt-in: MindSpeed with one fix, the ``group`` its Rewrite functions omit, where megatron-core requires it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from conformance.adapters.mindspeed.implementation import MindSpeedCoC

#: The megatron-core mappings MindSpeed's unchunked paths call without ``group``.
MAPPINGS = ("_reduce", "_reduce_scatter_along_first_dim", "_gather_along_first_dim")


def requires_group(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has a ``group`` parameter without a default (megatron-core 0.13+; 0.12's ``_reduce`` has none)."""
    parameter = inspect.signature(fn).parameters.get("group")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def with_tp_group(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` given the TP group when its caller leaves ``group`` out."""
    from megatron.core import parallel_state

    def call(input_: Any, group: Any = None, *args: Any, **kwargs: Any) -> Any:
        return fn(input_, group if group is not None else parallel_state.get_tensor_model_parallel_group(),
                  *args, **kwargs)

    return call


class MindSpeedCoCCompat(MindSpeedCoC):
    """MindSpeed, with the TP group passed to the mappings its Rewrite functions call without one.

    MindSpeed's unchunked row paths (``--coc-mode 1``, a token count below the
    chunk count, ``customized_coc`` to 1) call megatron's ``_reduce``,
    ``_reduce_scatter_along_first_dim`` and ``_gather_along_first_dim`` without
    ``group`` (``rewrite_parallel_linears_*.py``): a TypeError wherever
    megatron-core requires it.  Each mapping's signature is read first: one
    that takes no ``group``, or defaults it, is passed on unchanged.
    """

    name = "mindspeed-compat"

    def injected_functions(self) -> dict[str, Any]:
        injected = super().injected_functions()
        for name in MAPPINGS:
            if requires_group(injected[name]):
                injected[name] = with_tp_group(injected[name])
        return injected
