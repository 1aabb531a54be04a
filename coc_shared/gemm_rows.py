"""Whether a device's GEMM gives a row the same bits whatever other rows are multiplied with it.

A BLAS picks its kernel (tile sizes, split-K) by the shape of the call, so
the rows of a product of ``M`` rows may come out with other bits than the same
rows inside a larger product: on an NVIDIA H200, float32, for ``M`` up to 512
(``k = n = 1024``); on one CPU with MKL for ``M`` from 1 to 128 at that shape,
on another only for ``M`` from 1 to 3.  A deterministic mode that computes each
tile's partial with such a GEMM is still deterministic -- the same tiling gives
the same bits -- but not *split-invariant*: another tiling gives other bits.

The device check (``python -m conformance.bench device``) measures it: for a
few shapes ``k x n``, the rows of ``a[s:s+M] @ b`` against the same rows of the
whole product ``a @ b`` (``rows`` rows), for row counts ``M`` and offsets ``s``
(:func:`measure`).  It writes the result into its JSON under ``"gemm_rows"``;
an implementation that declares split invariance by device (the reference,
``coc_impl/split_invariance.py``) reads it from the file :data:`ENV` names::

    {"device": "cuda", "name": "NVIDIA H200", "dtype": "float32", "rows": 4096,
     "shapes": [{"k": 1024, "n": 1024, "differ_at": [1, 2, 3, 8, 16, ..., 512]}, ...]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coc_shared import device_measurements

#: Names the device check's JSON whose ``gemm_rows`` says where a GEMM is row-invariant (unset: not measured).
ENV = "COC_GEMM_ROWS"
#: Row counts measured: thin tiles, tail tiles either side of a power of two, and the tiles of real chunk counts.
ROW_COUNTS = (1, 2, 3, 4, 8, 15, 16, 17, 31, 32, 64, 100, 128, 255, 256, 512, 1000, 2048)
#: Where in the whole product a tile starts (a tile at an offset reads its rows from the middle of the operand).
OFFSETS = (0, 7)


class GemmRowsError(ValueError):
    """A measurement that cannot be read (the message names the file and the key)."""


@dataclass(frozen=True)
class ShapeRows:
    """One ``k x n`` weight: the row counts whose rows differ bitwise from the same rows of the whole product."""

    k: int
    n: int
    differ_at: tuple[int, ...]


@dataclass(frozen=True)
class GemmRows:
    """The measurement of one device kind and dtype."""

    device: str
    dtype: str
    rows: int
    shapes: tuple[ShapeRows, ...]
    name: str = ""

    def differ_from(self, min_rows: int = 1) -> list[int]:
        """The row counts of at least ``min_rows`` at which some row came out with other bits (empty: invariant)."""
        return sorted({m for s in self.shapes for m in s.differ_at if m >= min_rows})

    def invariant(self, min_rows: int = 1) -> bool:
        """Whether every tile of ``min_rows`` rows or more gives each row the bits it has in the whole product."""
        return not self.differ_from(min_rows)

    def text(self) -> str:
        lines = [f"GEMM rows on {self.device} {self.name} ({self.dtype}): the rows of a[s:s+M] @ b against the same "
                 f"rows of the whole {self.rows}-row product"]
        lines += [f"  k={s.k:<6} n={s.n:<6} " + (f"differ at M = {list(s.differ_at)}" if s.differ_at
                                                 else "the same bits at every M") for s in self.shapes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "name": self.name, "dtype": self.dtype, "rows": self.rows,
                "shapes": [{"k": s.k, "n": s.n, "differ_at": list(s.differ_at)} for s in self.shapes]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "gemm_rows") -> GemmRows:
        try:
            shapes = tuple(ShapeRows(int(s["k"]), int(s["n"]), tuple(int(m) for m in s["differ_at"]))
                           for s in doc["shapes"])
            measured = cls(str(doc["device"]), str(doc["dtype"]), int(doc["rows"]), shapes, str(doc.get("name", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise GemmRowsError(f"{where}: needs device, dtype, rows and shapes [{{k, n, differ_at}}] ({exc!r})") \
                from None
        if not measured.device or not shapes:
            raise GemmRowsError(f"{where}: names no device or no shape")
        return measured


def measure(device: str, shapes: Sequence[tuple[int, int]], rows: int, dtype: str = "float32", *,
            counts: Sequence[int] = ROW_COUNTS, offsets: Sequence[int] = OFFSETS, name: str = "") -> GemmRows:
    """Multiply ``rows x k`` by ``k x n`` on ``device`` whole and in tiles of each of ``counts`` rows at each of
    ``offsets``; which tiles' rows differ bitwise from the whole product's (seeded normal data)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    measured = []
    with torch.no_grad():
        for k, n in shapes:
            a = torch.randn(rows, k, generator=gen).to(device=device, dtype=torch_dtype)
            b = torch.randn(k, n, generator=gen).to(device=device, dtype=torch_dtype)
            whole = a @ b
            differ = [m for m in counts if any(s + m <= rows and not torch.equal(a[s:s + m] @ b, whole[s:s + m])
                                               for s in offsets)]
            measured.append(ShapeRows(k, n, tuple(differ)))
    return GemmRows(device.split(":")[0], dtype, rows, tuple(measured), name)


def load(path: str | Path) -> GemmRows:
    """The ``gemm_rows`` measurement of a device check's JSON (or of a file holding it alone)."""
    return GemmRows.from_dict(device_measurements.section(path, "gemm_rows", GemmRowsError), where=f"{path}: gemm_rows")


def configured() -> GemmRows | None:
    """The measurement the file named by :data:`ENV` holds, if set (read once per process and path)."""
    return device_measurements.configured(ENV, load)
