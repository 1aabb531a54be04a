"""``configure`` as MindSpeed does it: its parser, the validators that police CoC, and the checks of layer building.

The validators are discovered, not listed: every feature whose
``validate_args`` reads ``use_ascend_coc`` (branches move the CoC-with-TE
refusal between features: ``transformer_engine_basic`` up to core_r0.16.0,
``npu_enhancement`` from core_r0.17.0), and the CoC feature itself.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The argument every CoC-policing validator reads.
COC_FLAG = "use_ascend_coc"
#: Megatron-LM's defaults for the arguments MindSpeed's CoC validators read (Megatron-LM's parser is not here).
MEGATRON_DEFAULTS: Mapping[str, Any] = {
    "sequence_parallel": False, "fp8": None, "fp8_recipe": "delayed", "use_legacy_models": False,
    "expert_model_parallel_size": 1, "use_flash_attn": False, "gradient_accumulation_fusion": False,
}


@dataclass
class MindSpeedConfig:
    """What ``configure`` settled on: the protocol's fields and MindSpeed's own."""

    enabled: bool
    parallel_num: int
    fused_kernel: bool
    user_cfgs: dict[str, Any]
    coc_mode: int = -1
    args: argparse.Namespace = field(default_factory=argparse.Namespace, repr=False)


def feature_name(feature: Any) -> str:
    """A feature's name as an argument name (branches spell it ``use-ascend-coc`` or ``use_ascend_coc``)."""
    return str(getattr(feature, "feature_name", "")).replace("-", "_")


def polices_coc(feature: Any) -> bool:
    """Whether ``feature`` is the CoC feature, or its ``validate_args`` reads ``use_ascend_coc``."""
    if feature_name(feature) == COC_FLAG:
        return True
    try:
        source = inspect.getsource(type(feature).validate_args)
    except (OSError, TypeError, AttributeError):
        return False
    return COC_FLAG in source


def coc_feature(features: Sequence[Any]) -> Any:
    """The feature that registers ``--use-ascend-coc`` (MindSpeed's ``CoCFeature``)."""
    found = [f for f in features if feature_name(f) == COC_FLAG]
    if not found:
        raise ImportError(f"MindSpeed's feature list has no {COC_FLAG} feature (features: "
                          f"{sorted(feature_name(f) for f in features)})")
    return found[0]


def parse_mindspeed_args(features: Sequence[Any], parser_unknown_args: Any,
                         argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` as MindSpeed's ``get_mindspeed_args`` parses ``sys.argv`` (argparse may exit).

    Flags no feature registers go through MindSpeed's ``parser_unknown_args``
    where the branch has it importable, and are dropped otherwise.
    """
    parser = argparse.ArgumentParser(description="MindSpeed Arguments", allow_abbrev=False)
    for feature in features:
        feature.register_args(parser)
    known, unknown = parser.parse_known_args(list(argv))
    if parser_unknown_args is None:
        return known
    return argparse.Namespace(**parser_unknown_args(vars(known), unknown))


def add_megatron_args(args: argparse.Namespace, *, tp_size: int, num_experts: int | None, use_ascend_mc2: bool,
                      tp_2d: bool, transformer_impl: str) -> None:
    """The Megatron-LM arguments MindSpeed's CoC validators read: the protocol's, then Megatron-LM's defaults.

    MC2 runs only with sequence parallelism (MindSpeed's MC2 feature refuses
    it otherwise, and patches nothing), so asking for MC2 turns SP on: the
    refusal the suite looks for is CoC's, not a configuration MC2 never runs.
    Not with TP-2D, which refuses SP on every branch: MindSpeed has no
    configuration holding both (from core_r0.17.0 MC2 refuses SP off).
    """
    vars(args).update(tensor_model_parallel_size=tp_size, num_experts=num_experts, transformer_impl=transformer_impl)
    for key, value in MEGATRON_DEFAULTS.items():
        vars(args).setdefault(key, value)
    args.use_ascend_mc2 = bool(getattr(args, "use_ascend_mc2", False) or use_ascend_mc2)
    args.tp_2d = bool(getattr(args, "tp_2d", False) or tp_2d)
    if args.use_ascend_mc2 and not args.tp_2d:
        args.sequence_parallel = True
    if tp_2d and args.tp_x * args.tp_y != tp_size:
        args.tp_x, args.tp_y = tp_size, 1  # a valid 2-D layout: only TP-2D's CoC rule may refuse


def validate(features: Sequence[Any], args: argparse.Namespace) -> None:
    """``validate_args`` of the features that police CoC, in MindSpeed's order; their exceptions propagate."""
    for feature in features:
        if polices_coc(feature):
            feature.validate_args(args)


def check_as_layers_built(min_comm: Any, args: argparse.Namespace, cfgs: Mapping[str, Any], tp_size: int) -> None:
    """What MindSpeed checks when it builds a CoC layer, on a private ``MinCommConfig``.

    MindSpeed refuses a chunk count or mode (``acquire_module_type``,
    RuntimeError) and a malformed ``customized_coc`` key
    (``register_customized_coc``) only when the model is built.  That is still
    before any CoC collective, and the protocol ends configuration at
    ``configure``, so the same calls run here, without touching the global.
    """
    probe = min_comm.MinCommConfig()
    probe.coc_print_enabled = False
    probe.register_coc_get_param(args.coc_mode, args.coc_parallel_num, args.coc_fused_kernel)
    probe.register_customized_coc(cfgs.get("customized_coc", {}))
    probe.acquire_module_type(tp_size)
