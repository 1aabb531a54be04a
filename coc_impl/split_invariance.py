"""Where the reference's deterministic mode is split-invariant, which it declares to the suite.

``deterministic=True`` (:mod:`coc_impl.deterministic`) computes each tile's
float32 partial with one GEMM over the tile's rows, padded to at least
:data:`MIN_GEMM_ROWS`, and sums the ranks' partials in rank order.  Another
tiling gives the same bits exactly where that GEMM gives a row the same bits
whatever the tile's row count -- a property of the device's BLAS, not of this
code (:mod:`coc_shared.gemm_rows`), which differs from one machine to the next
(one MKL CPU rounds a row of ``k = n = 1024`` by its tile's row count up to 128
rows, another only up to 3).  So the claim is made per device kind, each
where a measurement says it holds:

* on the CPU, where this process measured it (:func:`cpu_rows`: once per
  process, a tenth of a second, on the shapes below), unless the device
  check's file says otherwise;
* on any device the device check measured it to hold on, from the file
  ``COC_GEMM_ROWS`` names; a device it was measured not to hold on (an H200's
  float32 GEMM, for up to 512 rows) never gets the claim, nor does a device
  never measured.
"""

from __future__ import annotations

import functools

from coc_shared import gemm_rows

#: Smallest row count a GEMM is run with (thinner tiles are zero-padded).
MIN_GEMM_ROWS = 16
#: The ops with a deterministic mode (the protocol's ``DETERMINISTIC_OPS``).
DETERMINISTIC_OPS = ("matmul_all_reduce", "matmul_reduce_scatter")
#: The CPU claim's measurement: weights ``k x n`` from the suite's small ones to ``1024 x 1024`` (where one MKL CPU
#: rounds by the row count), tiles of every row count a padded tile can have, up to a whole 256-row product.
CPU_SHAPES = ((96, 64), (1024, 1024))
CPU_ROWS = 256
CPU_COUNTS = (MIN_GEMM_ROWS, 17, 31, 32, 64, 100, 128, 255, 256)


@functools.cache
def cpu_rows() -> gemm_rows.GemmRows:
    """This machine's CPU GEMM (:data:`CPU_SHAPES`), measured once per process: with one thread (as the ranks run)
    and with the process's threads; a row count that differs in either differs."""
    import torch

    threads = torch.get_num_threads()
    differ: dict[tuple[int, int], set[int]] = {shape: set() for shape in CPU_SHAPES}
    try:
        for count in sorted({1, threads}):
            torch.set_num_threads(count)
            for shape in gemm_rows.measure("cpu", CPU_SHAPES, CPU_ROWS, counts=CPU_COUNTS).shapes:
                differ[(shape.k, shape.n)].update(shape.differ_at)
    finally:
        torch.set_num_threads(threads)
    return gemm_rows.GemmRows("cpu", "float32", CPU_ROWS, tuple(gemm_rows.ShapeRows(k, n, tuple(sorted(m)))
                                                                  for (k, n), m in differ.items()))


def split_invariant_devices() -> tuple[str, ...]:
    """The device kinds on which the deterministic ops are split-invariant (module docstring)."""
    measured = gemm_rows.configured()
    kinds = set()
    if (measured is None or measured.device != "cpu") and cpu_rows().invariant(MIN_GEMM_ROWS):
        kinds.add("cpu")
    if measured is not None and measured.invariant(MIN_GEMM_ROWS):
        kinds.add(measured.device)
    return tuple(sorted(kinds))


def split_invariant_ops() -> dict[str, tuple[str, ...]]:
    """The reference's ``split_invariant_ops`` declaration: the deterministic ops on each device kind above."""
    return {kind: DETERMINISTIC_OPS for kind in split_invariant_devices()}
