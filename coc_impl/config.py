"""CoC configuration: flags, legacy environment variables, user ``coc_cfgs``.

Sources, highest precedence first: explicit API arguments, command-line flags,
environment variables, defaults.  Disagreeing sources produce one
:class:`CoCConfigWarning`; settings that have no effect (chunk count under the
fused kernel, chunk count without ``--use-ascend-coc``) produce one too, so that
nothing a user configured is silently ignored.  Every validation happens here,
before any collective is issued, so a bad configuration fails identically on
every rank instead of leaving some ranks waiting in a collective.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Union

from coc_impl.errors import (
    CoCChunkCountError,
    CoCFusedTPError,
    CoCMoEError,
    CoCSettingValueError,
    CoCTP2DError,
    CoCTransformerEngineError,
    CoCUserCfgError,
    CoCWithMC2Error,
)

ParallelNum = Union[int, Literal["auto"]]

#: Chunk counts the scripted pipeline supports (1 means "no CoC").
VALID_CHUNKS: tuple[int, ...] = (1, 2, 4, 8)
#: TP size the fused (ATB) kernels are restricted to.
FUSED_TP_SIZE = 8

ENV_PARALLEL_NUM = "COC_PARALLEL_NUM"
ENV_FUSED = "USE_COC_FUSED_KERNEL"


class CoCConfigWarning(UserWarning):
    """A configured value is overridden or has no effect."""


_SHAPE_KEY = re.compile(r"^\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


@dataclass(frozen=True)
class UserCfgs:
    """The user ``coc_cfgs`` dictionary, validated.

    ``customized_coc`` maps a matmul shape ``(m, k, n)`` to the chunk count to
    use for it; it overrides ``parallel_num`` for that shape in every layer and
    mode.
    """

    matmul_soc_friendly: bool = True
    customized_coc: Mapping[tuple[int, int, int], int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    enable_coc_in_column_backward: bool = False
    recompute_all_gather: bool = True

    @classmethod
    def from_mapping(cls, cfgs: Mapping[str, Any] | str | os.PathLike | None) -> UserCfgs:
        """Validate a ``coc_cfgs`` dict (or a path to a JSON file holding one)."""
        if cfgs is None:
            return cls()
        cfgs = read_user_cfgs(cfgs)
        if not isinstance(cfgs, Mapping):
            raise CoCUserCfgError(f"coc_cfgs must be a dict, got {type(cfgs).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(cfgs) - known)
        if unknown:
            raise CoCUserCfgError(
                f"coc_cfgs has unknown key(s) {unknown}; known keys are {sorted(known)}"
            )
        values: dict[str, Any] = {}
        for key in ("matmul_soc_friendly", "enable_coc_in_column_backward", "recompute_all_gather"):
            if key in cfgs:
                if not isinstance(cfgs[key], bool):
                    raise CoCUserCfgError(
                        f"coc_cfgs[{key!r}] must be True or False, got {cfgs[key]!r}"
                    )
                values[key] = cfgs[key]
        if "customized_coc" in cfgs:
            values["customized_coc"] = _parse_customized(cfgs["customized_coc"])
        return cls(**values)

    def chunks_for(self, m: int, k: int, n: int) -> int | None:
        """The customised chunk count for matmul shape ``[m, k, n]``, if any."""
        return self.customized_coc.get((m, k, n))


def read_user_cfgs(cfgs: Mapping[str, Any] | str | os.PathLike) -> Any:
    """The ``coc_cfgs`` mapping itself, read from its JSON file when given a path."""
    if not isinstance(cfgs, (str, os.PathLike)):
        return cfgs
    try:
        return json.loads(Path(cfgs).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CoCUserCfgError(f"coc_cfgs file {cfgs!s} cannot be read: {exc}") from exc


def _parse_customized(raw: Any) -> Mapping[tuple[int, int, int], int]:
    if not isinstance(raw, Mapping):
        raise CoCUserCfgError(
            f"coc_cfgs['customized_coc'] must map '[m, k, n]' to a chunk count, got {raw!r}"
        )
    parsed: dict[tuple[int, int, int], int] = {}
    for key, value in raw.items():
        match = _SHAPE_KEY.match(key) if isinstance(key, str) else None
        if match is None:
            raise CoCUserCfgError(
                f"coc_cfgs['customized_coc'] key {key!r} is not of the form '[m, k, n]'"
            )
        if isinstance(value, bool) or value not in VALID_CHUNKS:
            raise CoCChunkCountError(
                f"coc_cfgs['customized_coc'][{key!r}] = {value!r}: chunk count must be one of "
                f"{list(VALID_CHUNKS)}"
            )
        parsed[(int(match[1]), int(match[2]), int(match[3]))] = value
    return MappingProxyType(parsed)


@dataclass(frozen=True)
class CoCConfig:
    """The effective CoC configuration after all sources were merged."""

    enabled: bool = False
    parallel_num: ParallelNum = 1
    fused_kernel: bool = False
    user_cfgs: UserCfgs = field(default_factory=UserCfgs)

    @property
    def scripted(self) -> bool:
        """True when the Python (scripted) pipeline is the active form.

        A ``customized_coc`` entry above 1 switches it on even with
        ``parallel_num`` 1: a per-shape chunk count is never silently ignored.
        """
        chunked = self.parallel_num != 1 or any(p != 1 for p in self.user_cfgs.customized_coc.values())
        return self.enabled and not self.fused_kernel and chunked

    def chunks_for(self, m: int, k: int, n: int) -> ParallelNum:
        """Chunk count for one matmul: ``customized_coc`` first, then ``parallel_num``.

        Returns 1 when CoC is disabled.  Shape rules are applied by the caller,
        which knows the layer and the TP size (:mod:`coc_impl.chunking`).
        """
        if not self.enabled:
            return 1
        custom = self.user_cfgs.chunks_for(m, k, n)
        return custom if custom is not None else self.parallel_num


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
class _Layer:
    """One source's view of the three flag-backed settings (None = unset)."""

    name: str
    enabled: bool | None = None
    parallel_num: ParallelNum | None = None
    fused_kernel: bool | None = None


def _cli_layer(argv: Sequence[str] | argparse.Namespace | None) -> _Layer:
    if argv is None:
        return _Layer("command line")
    if isinstance(argv, argparse.Namespace):
        ns = argv
    else:
        ns, _ = add_coc_args(argparse.ArgumentParser(add_help=False)).parse_known_args(list(argv))
    raw_num = getattr(ns, "coc_parallel_num", None)
    return _Layer(
        "command line",
        enabled=getattr(ns, "use_ascend_coc", None),
        parallel_num=None if raw_num is None else parse_parallel_num(raw_num, source="--coc-parallel-num"),
        fused_kernel=getattr(ns, "coc_fused_kernel", None),
    )


def _env_layer(env: Mapping[str, str] | None) -> _Layer:
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
    return _Layer("environment", enabled=enabled, parallel_num=num, fused_kernel=fused)


_SOURCE_FLAGS = {
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


def resolve_config(
    argv: Sequence[str] | argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    *,
    tp_size: int,
    enabled: bool | None = None,
    parallel_num: ParallelNum | str | None = None,
    fused_kernel: bool | None = None,
    coc_cfgs: Mapping[str, Any] | str | os.PathLike | None = None,
    num_experts: int | None = None,
    use_ascend_mc2: bool = False,
    tp_2d: bool = False,
    transformer_impl: str = "local",
) -> CoCConfig:
    """Merge API arguments, ``argv`` and ``env`` into the effective config.

    ``argv`` may be a list of command-line words or an already-parsed
    namespace; ``env`` defaults to ``os.environ``.  Raises a subclass of
    :class:`~coc_impl.errors.CoCConfigError` for any invalid or incompatible
    setting.  Pure and deterministic: every rank given the same inputs raises
    the same error, before any communication.
    """
    api = _Layer(
        "API",
        enabled=enabled,
        parallel_num=None if parallel_num is None else parse_parallel_num(parallel_num, source="parallel_num"),
        fused_kernel=fused_kernel,
    )
    layers = (api, _cli_layer(argv), _env_layer(env))
    if coc_cfgs is not None:
        coc_cfgs = read_user_cfgs(coc_cfgs)  # once: the ineffective-setting notes read the same mapping
    user_cfgs = UserCfgs.from_mapping(coc_cfgs)

    notes: list[str] = []
    chosen: dict[str, Any] = {}
    defaults = {"enabled": False, "parallel_num": 1, "fused_kernel": False}
    for setting, default in defaults.items():
        given = [(layer.name, getattr(layer, setting)) for layer in layers if getattr(layer, setting) is not None]
        if not given:
            chosen[setting] = default
            continue
        winner_source, winner = given[0]
        chosen[setting] = winner
        for source, value in given[1:]:
            if value != winner:
                notes.append(
                    f"{_SOURCE_FLAGS[source][setting]}={value!r} ({source}) is overridden by "
                    f"{_SOURCE_FLAGS[winner_source][setting]}={winner!r} ({winner_source})"
                )

    config = CoCConfig(
        enabled=bool(chosen["enabled"]),
        parallel_num=chosen["parallel_num"],
        fused_kernel=bool(chosen["fused_kernel"]),
        user_cfgs=user_cfgs,
    )
    _check_compatibility(
        config, tp_size=tp_size, num_experts=num_experts, use_ascend_mc2=use_ascend_mc2,
        tp_2d=tp_2d, transformer_impl=transformer_impl,
    )
    notes.extend(_ineffective_settings(config, coc_cfgs))
    if notes:
        warnings.warn("CoC configuration: " + "; ".join(notes), CoCConfigWarning, stacklevel=2)
    return config


def _check_compatibility(
    config: CoCConfig, *, tp_size: int, num_experts: int | None, use_ascend_mc2: bool,
    tp_2d: bool, transformer_impl: str,
) -> None:
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise CoCSettingValueError(
            f"--tensor-model-parallel-size must be a positive int, got {tp_size!r}"
        )
    if not config.enabled:
        return
    if use_ascend_mc2:
        raise CoCWithMC2Error(
            "--use-ascend-coc cannot be combined with --use-ascend-mc2: both rewrite the "
            "tensor-parallel linear layers; enable only one"
        )
    if num_experts:
        raise CoCMoEError(
            f"--use-ascend-coc does not support MoE models (--num-experts {num_experts})"
        )
    if tp_2d:
        raise CoCTP2DError("--use-ascend-coc does not support 2-D tensor parallelism (--tp-2d)")
    if transformer_impl != "local":
        raise CoCTransformerEngineError(
            f"--use-ascend-coc patches Megatron's local linear layers only; "
            f"--transformer-impl {transformer_impl} is not supported (use 'local')"
        )
    if config.fused_kernel and tp_size != FUSED_TP_SIZE:
        raise CoCFusedTPError(
            f"--coc-fused-kernel requires --tensor-model-parallel-size {FUSED_TP_SIZE} "
            f"(ATB restriction), got {tp_size}"
        )


def _ineffective_settings(config: CoCConfig, raw_cfgs: Any) -> list[str]:
    notes = []
    if not config.enabled:
        if config.parallel_num != 1 or config.fused_kernel:
            notes.append(
                "--coc-parallel-num/--coc-fused-kernel have no effect without --use-ascend-coc"
            )
        return notes
    if config.fused_kernel and config.parallel_num != 1:
        notes.append(
            f"--coc-parallel-num {config.parallel_num} has no effect: --coc-fused-kernel "
            "takes precedence"
        )
    explicit = raw_cfgs if isinstance(raw_cfgs, Mapping) else {}
    if not config.fused_kernel and explicit.get("enable_coc_in_column_backward"):
        notes.append("coc_cfgs['enable_coc_in_column_backward'] applies to the fused kernel only")
    if config.fused_kernel and "matmul_soc_friendly" in explicit:
        notes.append("coc_cfgs['matmul_soc_friendly'] applies to the scripted form only")
    return notes
