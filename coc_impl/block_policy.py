"""Which row blocks each pipelined matmul of a layer call is cut into: a :class:`BlockPolicy` per call.

A policy is asked once per matmul with its :class:`MatmulSite`, before the
matmul's collectives, from the configuration and shapes alone, so every rank
decides (or raises) alike.  The default, :func:`chunked_blocks`, is the scripted
form: equal blocks, the count from :func:`~coc_impl.chunking.resolve_chunks` for
the matmul's own ``(m, k, n)``, so ``customized_coc`` is honoured by every
layer, mode and direction; the fused kernel's layers use a tiling-plan policy
(:func:`coc_impl.fused.planned_blocks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypedDict

import torch
import torch.distributed as dist

from coc_impl.chunking import FallbackNotice, resolve_chunks
from coc_impl.config import CoCConfig
from coc_impl.overlap import equal_blocks

if TYPE_CHECKING:  # typing has NotRequired from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import NotRequired

__all__ = ["BlockPolicy", "LayerCall", "LayerCallKeywords", "MatmulSite", "chunked_blocks"]


@dataclass(frozen=True)
class MatmulSite:
    """One matmul of a layer call, ``[m, k] @ [k, n]``, pipelined with its collective.

    ``m`` is the full row count multiplied on this rank (SP: after the
    all-gather / before the reduce-scatter); the blocks tile ``split_rows``
    (the per-rank shard for gathers and reduce-scatters, else ``m``).
    """

    layer: str  #: names the layer, direction and collective in messages
    m: int
    k: int
    n: int
    split_rows: int
    itemsize: int  #: bytes per element of the multiplied rows
    device: torch.device  #: where the rows are: ``parallel_num auto`` measures there, over the layer's group
    gathers: bool = False  #: the collective moves the matmul's input rows (width k), not its output
    #: the column backward's dx: megatron already overlaps its collective with the dw matmul
    column_backward: bool = False


class BlockPolicy(Protocol):
    """Row blocks (summing to ``site.split_rows``) for one pipelined matmul.

    Called before the matmul's collectives, from the configuration and shapes
    alone, so every rank decides (or raises) alike.
    """

    def __call__(self, call: LayerCall, site: MatmulSite) -> Sequence[int]: ...


_ITEMSIZE_DTYPES = {2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


def _measured_chunks(call: LayerCall, site: MatmulSite) -> int:
    """``parallel_num auto``: the chunk count the live group's measured costs favour."""
    from coc_impl import autotune

    collective: autotune.Collective = ("all_gather" if site.gathers
                                       else "all_reduce" if site.split_rows == site.m else "reduce_scatter")
    return autotune.choose_chunks(site.m, site.k, site.n, group=call.group,
                                  dtype=_ITEMSIZE_DTYPES.get(site.itemsize, torch.float32),
                                  collective=collective, device=site.device)


def chunked_blocks(call: LayerCall, site: MatmulSite) -> list[int]:
    """The scripted form: equal blocks, ``customized_coc`` first, then ``parallel_num``."""
    chunks = resolve_chunks(
        call.config, m=site.m, k=site.k, n=site.n, tp=call.tp, layer=site.layer,
        sequence_parallel=call.sequence_parallel, notice=call.fallback_notice,
        auto=partial(_measured_chunks, call, site),
    )
    return equal_blocks(site.split_rows, chunks, what=site.layer)


class LayerCallKeywords(TypedDict):
    """The keywords of a backend's layer forward (``column_forward``, ``row_forward``): a :class:`LayerCall` but its
    policy, which the backend chooses."""

    group: dist.ProcessGroup
    sequence_parallel: bool
    config: CoCConfig
    gradient_accumulation_fusion: NotRequired[bool]


@dataclass(frozen=True)
class LayerCall:
    """The non-tensor arguments of one layer call (shared by its forward and backward)."""

    group: dist.ProcessGroup
    config: CoCConfig
    sequence_parallel: bool
    gradient_accumulation_fusion: bool = False
    policy: BlockPolicy = chunked_blocks
    fallback_notice: FallbackNotice = field(default_factory=FallbackNotice)

    @property
    def tp(self) -> int:
        return self.group.size()

    @property
    def soc_friendly(self) -> bool:
        """``matmul_soc_friendly`` is a setting of the scripted form only (``docs/DESIGN.md#configuration``)."""
        return self.config.user_cfgs.matmul_soc_friendly and not self.config.fused_kernel

    def blocks(self, site: MatmulSite) -> Sequence[int]:
        """The policy's row blocks for ``site``."""
        return self.policy(self, site)
