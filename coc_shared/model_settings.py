"""The model's settings a CoC implementation must be compatible with: ``configure``'s keywords.

One definition for the plug-in protocol (which re-exports it), the reference
and any implementation that types its ``configure`` as ``**model:
Unpack[ModelSettings]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # typing has NotRequired from 3.11; annotations are never evaluated, so 3.10 runs too
    from typing import NotRequired


class ModelSettings(TypedDict):
    """The model's settings CoC must be compatible with (``configure``'s keywords), as Megatron's flags give them;
    default in brackets."""

    tp_size: int
    """``--tensor-model-parallel-size``."""
    num_experts: NotRequired[int | None]
    """``--num-experts`` [None: no MoE]."""
    use_ascend_mc2: NotRequired[bool]
    """``--use-ascend-mc2`` [False]."""
    tp_2d: NotRequired[bool]
    """``--tp-2d`` [False]."""
    transformer_impl: NotRequired[str]
    """``--transformer-impl`` ["local"]."""
