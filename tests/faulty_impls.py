"""Deliberately broken implementations: proof that the conformance checks bite.

Each is a small subclass of the reference with one defect; tests in
``tests/test_suite_bites.py`` run the suite against them and expect the named
checks to fail.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from coc_impl.config import CoCConfig, resolve_config
from coc_impl.reference import ReferenceCoC


class EnvBeatsCommandLine(ReferenceCoC):
    """Legacy environment variables take precedence over command-line flags."""

    name = "fault-env-beats-cli"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        config = super().configure(argv, env, **kw)
        num = (env or {}).get("COC_PARALLEL_NUM")
        if num is not None and config.enabled:
            return CoCConfig(True, int(num), config.fused_kernel, config.user_cfgs)
        return config


class SilentOverrides(ReferenceCoC):
    """Resolves correctly but never says a setting was overridden or ignored."""

    name = "fault-silent"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return super().configure(argv, env, **kw)


class UntypedErrors(ReferenceCoC):
    """Refuses CoC with MC2, but with a bare ValueError."""

    name = "fault-untyped"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        if kw.get("use_ascend_mc2"):
            raise ValueError("no")
        return super().configure(argv, env, **kw)


class AcceptsAnyChunkCount(ReferenceCoC):
    """Lets an unsupported chunk count through."""

    name = "fault-any-chunks"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        argv = [a if a not in ("3", "16", "many") else "2" for a in (argv or [])]
        env = {k: ("2" if k == "COC_PARALLEL_NUM" else v) for k, v in (env or {}).items()}
        return super().configure(argv, env, **kw)


class ChecksOnRankZeroOnly(ReferenceCoC):
    """Validates on rank 0 only; the other ranks go on to a collective (upstream prints on device 0)."""

    name = "fault-rank0-check"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_rank() == 0:
            return super().configure(argv, env, **kw)
        dist.all_reduce(torch.zeros(1))  # e.g. agreeing on a setting
        return resolve_config(None, {}, tp_size=kw["tp_size"])


class AgreesBeforeValidating(ReferenceCoC):
    """Issues a collective (to agree on settings) before it validates them."""

    name = "fault-collective-first"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
        return super().configure(argv, env, **kw)
