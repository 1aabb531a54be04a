"""What the overlap engine multiplies each block of rows by: a plain callable or a :class:`Product`.

A plain :data:`Matmul` returns each block's product as a fresh tensor, which
the engine then copies into the result.  A :class:`Product` can also write a
block straight into its rows of the result (one allocation, no copy), and
lays its operands out so that a thin tile runs the same BLAS kernel as the
rows of a large matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["Matmul", "Product", "gemm_dense"]

#: One block of rows ``[b, k]`` -> its outputs ``[b, n]``.  The caller owns
#: transposition, padding and dequantisation; the engine only slices rows.
Matmul = Callable[[torch.Tensor], torch.Tensor]


def gemm_dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself where a GEMM reads it as one dense block (row- or column-major), else a contiguous copy.

    A column slice of a wider buffer (row stride above the row length) is copied:
    torch's CPU bfloat16 GEMM reads past the end of each such row (torch 2.13:
    NaN padding beside a ``[257, 3]`` slice comes back as NaN rows).
    """
    if t.dim() != 2 or t.is_contiguous() or t.t().is_contiguous():
        return t
    return t.contiguous()


@dataclass(frozen=True)
class Product:
    """``rows @ right`` for the engine, optionally straight into the result's rows.

    ``pad_k`` zero columns are appended to every block of rows (``right``
    already holds the matching zero rows: the soc-friendly re-lay), and a
    block thinner than ``min_rows`` is zero-padded to that many rows, so that
    thin tiles run the same BLAS kernel as the rows of a large matmul.
    """

    right: torch.Tensor  #: ``[k + pad_k, n]``
    pad_k: int = 0
    min_rows: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "right", gemm_dense(self.right))

    def _lhs(self, rows: torch.Tensor) -> torch.Tensor:
        lhs = F.pad(rows, (0, self.pad_k)) if self.pad_k else gemm_dense(rows)
        short = self.min_rows - lhs.shape[0]
        return F.pad(lhs, (0, 0, 0, short)) if short > 0 else lhs

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """The product of ``rows`` as a fresh tensor (a :data:`Matmul`)."""
        return torch.matmul(self._lhs(rows), self.right)[: rows.shape[0]]

    def empty(self, rows: torch.Tensor) -> torch.Tensor:
        """An uninitialised result for all of ``rows``."""
        return rows.new_empty((rows.shape[0], self.right.shape[1]), dtype=self.right.dtype)

    def into(self, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the product of ``rows`` into ``out`` (contiguous ``[rows, n]``) and return it."""
        if rows.shape[0] < self.min_rows:
            return out.copy_(self(rows))
        return torch.matmul(self._lhs(rows), self.right, out=out)
