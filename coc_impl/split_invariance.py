"""Where the reference's deterministic mode is split-invariant, which it declares to the suite.

``deterministic=True`` (:mod:`coc_impl.deterministic`) computes each tile's
float32 partial with one GEMM over the tile's rows, padded to at least
:data:`MIN_GEMM_ROWS`, and sums the ranks' partials in rank order.  Another
tiling gives the same bits exactly where that GEMM gives a row the same bits
whatever the tile's row count -- a property of the device's BLAS, not of this
code (:mod:`coc_shared.gemm_rows`).  So the claim is made per device kind:

* on the CPU, where it was measured to hold (``tests/unit/test_deterministic.py``
  holds it on the CI machine, at 1 and 2 threads, ``k`` up to 4096), unless a
  measurement says otherwise;
* on any device the device check measured it to hold on, from the file
  ``COC_GEMM_ROWS`` names; a device it was measured not to hold on (an H200's
  float32 GEMM, for up to 512 rows) never gets the claim, nor does a device
  never measured.
"""

from __future__ import annotations

from coc_shared import gemm_rows

#: Smallest row count a GEMM is run with (thinner tiles are zero-padded).
MIN_GEMM_ROWS = 16
#: The ops with a deterministic mode (the protocol's ``DETERMINISTIC_OPS``).
DETERMINISTIC_OPS = ("matmul_all_reduce", "matmul_reduce_scatter")


def split_invariant_devices() -> tuple[str, ...]:
    """The device kinds on which the deterministic ops are split-invariant (module docstring)."""
    measured = gemm_rows.configured()
    kinds = {"cpu"}
    if measured is not None:
        kinds.discard(measured.device)
        if measured.invariant(MIN_GEMM_ROWS):
            kinds.add(measured.device)
    return tuple(sorted(kinds))


def split_invariant_ops() -> dict[str, tuple[str, ...]]:
    """The reference's ``split_invariant_ops`` declaration: the deterministic ops on each device kind above."""
    return {kind: DETERMINISTIC_OPS for kind in split_invariant_devices()}
