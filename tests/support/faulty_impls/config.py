"""Faults of ``configure``: settings resolved wrongly or silently, refusals untyped or missing, errors raised on
some ranks only (or after a collective), and a process ended from inside ``configure``."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from coc_impl.config import CoCConfig, resolve_config
from coc_impl.reference import ReferenceCoC
from tests.support.faulty_impls._shared import _ConfigureWith


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


class _RefusesMC2(ReferenceCoC):
    """Refuses CoC with MC2 (``use_ascend_mc2``) first of all, raising :meth:`refusal`."""

    def refusal(self) -> Exception:
        raise NotImplementedError

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        if kw.get("use_ascend_mc2"):
            raise self.refusal()
        return super().configure(argv, env, **kw)


class _CollectiveBeforeConfigure(ReferenceCoC):
    """The ranks in :attr:`joining` issue an all-reduce (to agree on a setting) before ``configure`` validates."""

    joining: tuple[int, ...] | None = None  #: None: every rank

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        import torch
        import torch.distributed as dist

        if dist.is_initialized() and (self.joining is None or dist.get_rank() in self.joining):
            dist.all_reduce(torch.zeros(1))
        return super().configure(argv, env, **kw)


class UntypedErrors(_RefusesMC2):
    """Refuses CoC with MC2, but with a bare ValueError."""

    name = "fault-untyped"

    def refusal(self) -> Exception:
        return ValueError("no")


class AcceptsMoE(_ConfigureWith):
    """Accepts CoC with MoE (``num_experts``): allowed when its results are right, against the documented refusal."""

    name = "fault-accepts-moe"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        return {"num_experts": None}


class AcceptsAnyChunkCount(ReferenceCoC):
    """Lets an unsupported chunk count through."""

    name = "fault-any-chunks"

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        argv = [a if a not in ("3", "16", "many") else "2" for a in (argv or [])]
        env = {k: ("2" if k == "COC_PARALLEL_NUM" else v) for k, v in (env or {}).items()}
        return super().configure(argv, env, **kw)


class AcceptsEverything(_ConfigureWith, AcceptsAnyChunkCount):
    """Refuses no incompatible setting (MC2, MoE, 2-D TP, Transformer Engine) and no chunk count."""

    name = "fault-accepts-everything"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        return {"use_ascend_mc2": False, "num_experts": None, "tp_2d": False, "transformer_impl": "local"}


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


class AgreesBeforeValidating(_CollectiveBeforeConfigure):
    """Issues a collective (to agree on settings) on every rank before it validates them."""

    name = "fault-collective-first"


class ConfigureHangsOnOneRank(_CollectiveBeforeConfigure):
    """configure waits in a collective on rank 1 only: every other rank returns."""

    name = "fault-configure-hangs"
    joining = (1,)


class ConfigureRaisesOnOneRank(_ConfigureWith):
    """configure refuses MC2 on rank 0 only."""

    name = "fault-configure-raises-once"

    def forced(self, kw: Mapping[str, Any]) -> dict[str, Any]:
        import torch.distributed as dist

        return {"use_ascend_mc2": False} if dist.is_initialized() and dist.get_rank() != 0 else {}


class _EndsItsProcess(ReferenceCoC):
    """configure of the plain fused flags at TP 8 ends the process calling it by :meth:`end`."""

    def end(self) -> None:
        raise NotImplementedError

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, **kw: Any) -> CoCConfig:
        if list(argv or ()) == ["--use-ascend-coc", "--coc-fused-kernel"] and kw.get("tp_size") == 8:
            self.end()
        return super().configure(argv, env, **kw)


class KillsItsTestProcess(_EndsItsProcess):
    """configure of the plain fused flags at TP 8 kills the process calling it (an xdist worker, in-process)."""

    name = "fault-kills-worker"

    def end(self) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


class ExitsItsTestProcess(_EndsItsProcess):
    """configure of the plain fused flags at TP 8 calls ``os._exit(0)`` in the process calling it (issue 50: in one
    pytest process the run ended, exit status 0, with no summary)."""

    name = "fault-exits-with-zero"

    def end(self) -> None:
        import os

        os._exit(0)


class RefusesMC2WhileOff(_RefusesMC2):
    """Refuses MC2 before looking whether CoC is enabled at all: a run without CoC cannot use MC2."""

    name = "fault-refuses-mc2-while-off"

    def refusal(self) -> Exception:
        from coc_impl.errors import CoCWithMC2Error

        return CoCWithMC2Error("CoC cannot be combined with MC2 (use_ascend_mc2)")
