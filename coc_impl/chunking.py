"""How many chunks one matmul of a TP layer is cut into (scripted CoC).

Decided from the configuration and the shapes alone (no communication), so
every rank reaches the same decision, and raises the same error, before any
collective is issued.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from coc_impl.config import CoCConfig
from coc_impl.errors import CoCShapeError


class CoCChunkFallbackWarning(UserWarning):
    """The matmul has fewer rows than chunks; it runs unchunked (p = 1)."""


@dataclass
class FallbackNotice:
    """Shared by the matmuls of one layer call (forward and backward), so that
    a call whose token count is below the chunk count warns once, not per matmul."""

    given: bool = False


def resolve_chunks(
    config: CoCConfig,
    *,
    m: int,
    k: int,
    n: int,
    tp: int,
    layer: str,
    sequence_parallel: bool,
    notice: FallbackNotice | None = None,
    auto: Callable[[], int] | None = None,
) -> int:
    """Chunk count ``p`` for the matmul ``[m, k] @ [k, n]`` of ``layer`` on one rank.

    ``m`` is the matmul's full row count on the rank (for SP: after the
    all-gather / before the reduce-scatter, i.e. ``tp`` times the shard).
    Order: ``customized_coc[(m, k, n)]``, else ``parallel_num`` ("auto" asks
    ``auto()``, the measured choice, or 1 without one); 1 when CoC is disabled.  ``m < p`` falls back to 1
    with one :class:`CoCChunkFallbackWarning` (one per ``notice``), as
    upstream does.  Rows that
    cannot be split exactly (``m % p``; with SP ``m % tp`` or ``(m / tp) % p``)
    raise :class:`~coc_impl.errors.CoCShapeError` naming m, p, tp and the layer
    instead of leaving rows unwritten.
    """
    chunks = config.chunks_for(m, k, n)
    if chunks == "auto":
        # The planner's measured choice (coc_impl.autotune) where the caller can measure, else no CoC.
        chunks = auto() if auto is not None else 1
    if chunks == 1:
        return 1
    if m < chunks:
        if notice is None or not notice.given:
            warnings.warn(
                f"CoC: {layer}: matmul [m={m}, k={k}, n={n}] has fewer rows than the {chunks} "
                f"chunks requested; running it unchunked (p=1)",
                CoCChunkFallbackWarning,
                stacklevel=2,
            )
        if notice is not None:
            notice.given = True
        return 1
    where = f"CoC: {layer} (sequence_parallel={sequence_parallel}): m={m}, p={chunks}, tp={tp}"
    if m % chunks != 0:
        raise CoCShapeError(f"{where}: m is not a multiple of the chunk count p")
    if sequence_parallel:
        if m % tp != 0:
            raise CoCShapeError(f"{where}: m is not a multiple of tp")
        if (m // tp) % chunks != 0:
            raise CoCShapeError(
                f"{where}: the {m // tp} rows per rank are not a multiple of the chunk count p"
            )
    return chunks
