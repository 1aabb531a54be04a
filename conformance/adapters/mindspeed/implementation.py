"""The adapter: MindSpeed's scripted CoC behind the plug-in protocol (version 2)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.adapters.mindspeed.configuration import (
    MindSpeedConfig,
    add_megatron_args,
    check_as_layers_built,
    coc_feature,
    parse_mindspeed_args,
    validate,
)
from conformance.adapters.mindspeed.layer_patch import megatron_functions, patched_layers
from conformance.adapters.mindspeed.loading import load_mindspeed
from conformance.adapters.mindspeed.provenance import installed_megatron_core, notes, shipped


class ExpectationsMismatchWarning(UserWarning):
    """The checkout is not the branch, commit or megatron-core release its shipped expectations were written for."""


class MindSpeedCoC:
    """MindSpeed's scripted CoC as written (any feature-manager branch), judged by the suite on CPU."""

    name = "mindspeed"
    protocol_version = 2
    #: What MindSpeed's autograd functions do (``coc_parallel_linears_all_reduce.py``,
    #: ``coc_parallel_linears_sequence_parallel.py``; the same on every branch).  The column backward is
    #: never chunked: it issues one asynchronous all-reduce (SP off) or reduce-scatter (SP on) of the input
    #: gradient and computes the weight gradient while it is in flight.
    overlap = {
        "column/nosp/backward": "overlaps:weight_grad",
        "column/sp/forward": "chunked",
        "column/sp/backward": "overlaps:weight_grad",
        "row/nosp/forward": "chunked",
        "row/sp/forward": "chunked",
        "row/sp/backward": "chunked",
    }
    #: ``--coc-fused-kernel`` runs ATB/LCAL kernels (``mindspeed/ops/lcal_functional.py``, built
    #: against CANN and torch_npu at import): nothing of it can run on a CPU.
    fused_layers = False
    # No error_types: MindSpeed refuses with AssertionError / RuntimeError / SystemExit, classes
    # that are not specific to any kind of refusal.

    def __init__(self) -> None:
        self._ms = load_mindspeed()
        #: Lines for the run's report: the checkout is not what its expectations were written for.
        self.notes = tuple(notes(self._ms.checkout, installed_megatron_core(), shipped()))
        for note in self.notes:
            warnings.warn(note, ExpectationsMismatchWarning, stacklevel=2)

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, *, tp_size: int,
                  num_experts: int | None = None, use_ascend_mc2: bool = False, tp_2d: bool = False,
                  transformer_impl: str = "local", coc_cfgs: Mapping[str, Any] | None = None) -> MindSpeedConfig:
        """MindSpeed's parsing and checks; ``env`` is unused (the feature-manager CoC reads no variable)."""
        ms = self._ms
        args = parse_mindspeed_args(ms.features, ms.parser_unknown_args, argv or [])
        add_megatron_args(args, tp_size=tp_size, num_experts=num_experts, use_ascend_mc2=use_ascend_mc2,
                          tp_2d=tp_2d, transformer_impl=transformer_impl)
        validate(ms.features, args)
        cfgs = {**ms.user_config._COC_CFGS, **dict(coc_cfgs or {})}  # MindSpeed reads them unchecked
        enabled = bool(coc_feature(ms.features).is_need_apply(args))
        if enabled:
            check_as_layers_built(ms.min_comm, args, cfgs, tp_size)
        return MindSpeedConfig(enabled, int(args.coc_parallel_num), bool(args.coc_fused_kernel), cfgs,
                               int(args.coc_mode), args)

    def patch_megatron(self, config: MindSpeedConfig) -> Any:
        """megatron.core's layers run MindSpeed's CoC forward while the block is active."""
        return patched_layers(self._ms, config, self.injected_functions())

    def injected_functions(self) -> dict[str, Any]:
        """The megatron-core functions MindSpeed's layer ``__init__`` is given (as its adaptor gives them)."""
        return megatron_functions()
