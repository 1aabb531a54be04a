"""Where a CoC setting comes from: API arguments, command-line flags, legacy environment variables.

Each source is read into a :class:`SourceLayer` (None where the source is silent),
with its values validated and named by the flag or variable they came from, so
:func:`coc_impl.config.resolve_config` can merge them by precedence and name the
losers of a disagreement.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from coc_impl.errors import CoCChunkCountError, CoCSettingValueError

__all__ = [
    "ENV_FUSED", "ENV_PARALLEL_NUM", "SOURCE_FLAGS", "VALID_CHUNKS", "ParallelNum", "SourceLayer", "add_coc_args",
    "cli_layer", "env_layer", "parse_parallel_num",
]

ParallelNum = Union[int, Literal["auto"]]

#: Chunk counts the scripted pipeline supports (1 means "no CoC").
VALID_CHUNKS: tuple[int, ...] = (1, 2, 4, 8)

ENV_PARALLEL_NUM = "COC_PARALLEL_NUM"
ENV_FUSED = "USE_COC_FUSED_KERNEL"


def parse_parallel_num(raw: Any, *, source: str) -> ParallelNum:
    """Validate a chunk count from ``source`` (a flag or variable name)."""
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text == "auto":
            return "auto"
        try:
            raw = int(text)
        except ValueError:
            raise CoCChunkCountError(
                f"{source}={raw!r}: chunk count must be one of {list(VALID_CHUNKS)} or 'auto'"
            ) from None
    if isinstance(raw, bool) or raw not in VALID_CHUNKS:
        raise CoCChunkCountError(
            f"{source}={raw!r}: chunk count must be one of {list(VALID_CHUNKS)} or 'auto'"
        )
    return int(raw)


def _parse_bool_env(raw: str, *, source: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise CoCSettingValueError(f"{source}={raw!r}: expected 0/1 (or true/false)")


def add_coc_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the CoC flags to a Megatron-style argparse parser.

    Defaults are ``None`` so that "not given" can be told from "given the
    default", which the precedence rules need.
    """
    group = parser.add_argument_group("CoC (communication over computation)")
    group.add_argument(
        "--use-ascend-coc", action="store_true", default=None,
        help="Overlap the TP linear layers' matmul with their collective.",
    )
    group.add_argument(
        "--coc-parallel-num", default=None, metavar="{1,2,4,8,auto}",
        help="Chunks along m for the scripted pipeline (1 = off, auto = planner).",
    )
    group.add_argument(
        "--coc-fused-kernel", action="store_true", default=None,
        help="Use the fused kernels (TP = 8 only); overrides --coc-parallel-num.",
    )
    return parser


@dataclass(frozen=True)
class SourceLayer:
    """One source's view of the three flag-backed settings (None = unset)."""

    name: str
    enabled: bool | None = None
    parallel_num: ParallelNum | None = None
    fused_kernel: bool | None = None


def cli_layer(argv: Sequence[str] | argparse.Namespace | None) -> SourceLayer:
    if argv is None:
        return SourceLayer("command line")
    if isinstance(argv, argparse.Namespace):
        ns = argv
    else:
        ns, _ = add_coc_args(argparse.ArgumentParser(add_help=False)).parse_known_args(list(argv))
    raw_num = getattr(ns, "coc_parallel_num", None)
    return SourceLayer(
        "command line",
        enabled=getattr(ns, "use_ascend_coc", None),
        parallel_num=None if raw_num is None else parse_parallel_num(raw_num, source="--coc-parallel-num"),
        fused_kernel=getattr(ns, "coc_fused_kernel", None),
    )


def env_layer(env: Mapping[str, str] | None) -> SourceLayer:
    env = os.environ if env is None else env
    num: ParallelNum | None = None
    fused: bool | None = None
    if ENV_PARALLEL_NUM in env:
        num = parse_parallel_num(env[ENV_PARALLEL_NUM], source=ENV_PARALLEL_NUM)
    if ENV_FUSED in env:
        fused = _parse_bool_env(env[ENV_FUSED], source=ENV_FUSED)
    enabled = None
    if num is not None or fused is not None:
        # The legacy variables switch CoC on when either asks for it.
        enabled = bool(fused) or (num is not None and num != 1)
    return SourceLayer("environment", enabled=enabled, parallel_num=num, fused_kernel=fused)


SOURCE_FLAGS = {
    "API": {"enabled": "enabled", "parallel_num": "parallel_num", "fused_kernel": "fused_kernel"},
    "command line": {
        "enabled": "--use-ascend-coc",
        "parallel_num": "--coc-parallel-num",
        "fused_kernel": "--coc-fused-kernel",
    },
    "environment": {
        "enabled": f"{ENV_PARALLEL_NUM}/{ENV_FUSED}",
        "parallel_num": ENV_PARALLEL_NUM,
        "fused_kernel": ENV_FUSED,
    },
}
