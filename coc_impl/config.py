"""The effective CoC configuration: its sources merged by precedence, checked against the model's settings.

The sources are read by :mod:`coc_impl.config_sources` (API arguments, flags,
legacy environment variables) and :mod:`coc_impl.user_cfgs` (the user's ``coc_cfgs``).

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
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coc_impl.config_sources import SOURCE_FLAGS, ParallelNum, SourceLayer, cli_layer, env_layer, parse_parallel_num
from coc_impl.errors import (
    CoCFusedTPError,
    CoCMoEError,
    CoCSettingValueError,
    CoCTP2DError,
    CoCTransformerEngineError,
    CoCWithMC2Error,
)
from coc_impl.user_cfgs import UserCfgs, read_user_cfgs
from coc_shared.model_settings import ModelSettings

if TYPE_CHECKING:  # typing has Unpack from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import Unpack

#: TP size the fused (ATB) kernels are restricted to.
FUSED_TP_SIZE = 8


class CoCConfigWarning(UserWarning):
    """A configured value is overridden or has no effect."""


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


def resolve_config(
    argv: Sequence[str] | argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    *,
    enabled: bool | None = None,
    parallel_num: ParallelNum | str | None = None,
    fused_kernel: bool | None = None,
    coc_cfgs: Mapping[str, Any] | str | os.PathLike | None = None,
    **model: Unpack[ModelSettings],
) -> CoCConfig:
    """Merge API arguments, ``argv`` and ``env`` into the effective config.

    ``argv`` may be a list of command-line words or an already-parsed
    namespace; ``env`` defaults to ``os.environ``.  Raises a subclass of
    :class:`~coc_impl.errors.CoCConfigError` for any invalid or incompatible
    setting.  Pure and deterministic: every rank given the same inputs raises
    the same error, before any communication.
    """
    api = SourceLayer(
        "API",
        enabled=enabled,
        parallel_num=None if parallel_num is None else parse_parallel_num(parallel_num, source="parallel_num"),
        fused_kernel=fused_kernel,
    )
    layers = (api, cli_layer(argv), env_layer(env))
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
                    f"{SOURCE_FLAGS[source][setting]}={value!r} ({source}) is overridden by "
                    f"{SOURCE_FLAGS[winner_source][setting]}={winner!r} ({winner_source})"
                )

    config = CoCConfig(
        enabled=bool(chosen["enabled"]),
        parallel_num=chosen["parallel_num"],
        fused_kernel=bool(chosen["fused_kernel"]),
        user_cfgs=user_cfgs,
    )
    _check_compatibility(config, **model)
    notes.extend(_ineffective_settings(config, coc_cfgs))
    if notes:
        warnings.warn("CoC configuration: " + "; ".join(notes), CoCConfigWarning, stacklevel=2)
    return config


def _check_compatibility(
    config: CoCConfig, *, tp_size: int, num_experts: int | None = None, use_ascend_mc2: bool = False,
    tp_2d: bool = False, transformer_impl: str = "local",
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
