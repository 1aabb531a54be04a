"""What an adapter of an implementation with no CoC setting but the switch shares: its ``configure`` and config.

ColossalAI's ring ops and torch's async-TP ops read no chunk count, variable,
model setting or ``coc_cfgs``: ``--use-ascend-coc`` is all ``configure`` has to
translate, so none of the rest is refused or warned about.  Only the ops exist
there; neither has fused-kernel layers.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class SwitchConfig:
    """What ``configure`` settled on: CoC on or off, and the chunk count the implementation runs with."""

    enabled: bool
    parallel_num: int = 1
    fused_kernel: bool = False
    user_cfgs: None = None  #: no coc_cfgs counterpart: the suite's user_cfgs checks skip


class SwitchOnlyAdapter:
    """The protocol's declarations and ``configure`` for an implementation of the ops alone, switched on by
    ``--use-ascend-coc``."""

    protocol_version = 2
    #: Only the ops exist here; there are no fused-kernel layers.
    fused_layers = False

    def configure(self, argv: Sequence[str] | None, env: Mapping[str, str] | None, *, tp_size: int,
                  num_experts: int | None = None, use_ascend_mc2: bool = False, tp_2d: bool = False,
                  transformer_impl: str = "local", coc_cfgs: Mapping[str, Any] | None = None) -> SwitchConfig:
        """``--use-ascend-coc`` is the switch; nothing else is read."""
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        parser.add_argument("--use-ascend-coc", action="store_true")
        known, _ = parser.parse_known_args(list(argv or ()))
        return SwitchConfig(bool(known.use_ascend_coc), self.parallel_num(tp_size))

    def parallel_num(self, tp_size: int) -> int:
        """The chunk count the implementation runs with at ``tp_size`` (1: it does not chunk)."""
        return 1
