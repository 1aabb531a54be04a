"""How much dearer a matmul gets when it is cut into row chunks, on one device.

A BLAS picks other kernels for ``m/c`` rows than for ``m``: smaller tiles,
no split-K, less of the device busy.  So ``c`` row-chunks multiplied one
after the other cost more than the whole product -- on an H100, 8 chunks
cost 1.15x to 3x the whole, by shape.  A model that takes a chunk's matmul
as ``1/c`` of the whole (a line through the origin) overrates CoC.  The
device check (``python -m conformance.bench device``) measures this
efficiency: for a few Megatron shapes and ``c = 2, 4, 8, 16`` the *ratio*
of the time of ``c`` row-chunks to the time of the whole product.  It
writes the table into its JSON under ``"chunk_efficiency"``; the pipeline
model (:func:`chunked_matmul`) and ``--coc-parallel-num auto`` read it from
the file :data:`ENV` names.

Table (``"chunk_efficiency"`` of the device check's JSON)::

    {"device": "cuda", "name": "NVIDIA H100 ...", "dtype": "bfloat16",
     "shapes": [{"m": 4096, "k": 4096, "n": 4096, "whole_ms": 0.21,
                 "ratio": {"2": 1.02, "4": 1.06, "8": 1.15, "16": 1.4}}, ...]}
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coc_shared import device_measurements

#: Names the device check's JSON whose ``chunk_efficiency`` the model and ``auto`` use (unset: none).
ENV = "COC_CHUNK_EFFICIENCY"
#: Chunk counts the device check measures.
CHUNKS = (2, 4, 8, 16)


class EfficiencyError(ValueError):
    """A chunk-efficiency table that cannot be read (the message names the file and the key)."""


def chunk_ratio(whole_ms: Sequence[float], chunked_ms: Sequence[float]) -> float:
    """The ratio of ``c`` row-chunks to the whole product: the median of per-round ratios.

    Each round timed the whole product and its chunks back to back, so the
    drift of a shared machine cancels in each ratio.
    """
    if not whole_ms or len(whole_ms) != len(chunked_ms):
        raise ValueError(f"need equal, non-empty rounds, got {len(whole_ms)} and {len(chunked_ms)}")
    return float(statistics.median(c / w for w, c in zip(whole_ms, chunked_ms, strict=True)))


@dataclass(frozen=True)
class ShapeEfficiency:
    """One measured shape: ``ratio[c]`` = time of ``c`` row-chunks / time of the whole product."""

    m: int
    k: int
    n: int
    ratio: Mapping[int, float]

    def at(self, chunks: float) -> float:
        """The ratio for ``chunks`` (1 is the whole product; linear in between, flat past the last)."""
        points = sorted({1: 1.0, **self.ratio}.items())
        if chunks <= 1:
            return 1.0
        for (c0, r0), (c1, r1) in zip(points, points[1:], strict=False):
            if chunks <= c1:
                return r0 + (r1 - r0) * (chunks - c0) / (c1 - c0)
        return points[-1][1]


@dataclass(frozen=True)
class ChunkEfficiency:
    """The table of one device and dtype; :meth:`ratio` answers for any shape from the nearest one."""

    shapes: tuple[ShapeEfficiency, ...]
    device: str = ""
    dtype: str = ""

    def nearest(self, m: int, k: int, n: int) -> ShapeEfficiency:
        """The measured shape closest in per-chunk work (``log`` of rows per chunk times ``k*n``)."""
        return min(self.shapes, key=lambda s: abs(math.log(s.m * s.k * s.n) - math.log(max(1, m * k * n))))

    def ratio(self, chunks: float, m: int, k: int, n: int) -> float:
        return self.nearest(m, k, n).at(chunks)

    def text(self, names: Sequence[str] = ()) -> str:
        """The table as text: one row per shape, one column per chunk count."""
        counts = sorted({c for s in self.shapes for c in s.ratio})
        lines = [f"chunked-GEMM efficiency on {self.device} ({self.dtype}): time of c row-chunks / whole product",
                 f"{'shape':<16} {'m':>6} {'k':>6} {'n':>6} " + " ".join(f"{'c=' + str(c):>7}" for c in counts)]
        for i, s in enumerate(self.shapes):
            name = names[i] if i < len(names) else ""
            lines.append(f"{name:<16} {s.m:>6} {s.k:>6} {s.n:>6} "
                         + " ".join(f"{s.ratio[c]:>7.3f}" if c in s.ratio else f"{'-':>7}" for c in counts))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "dtype": self.dtype,
                "shapes": [{"m": s.m, "k": s.k, "n": s.n, "ratio": {str(c): r for c, r in sorted(s.ratio.items())}}
                           for s in self.shapes]}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "chunk_efficiency") -> ChunkEfficiency:
        try:
            shapes = tuple(
                ShapeEfficiency(int(s["m"]), int(s["k"]), int(s["n"]),
                                {int(c): float(r) for c, r in s["ratio"].items()})
                for s in doc["shapes"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EfficiencyError(f"{where}: each shape needs m, k, n and ratio {{chunks: ratio}} ({exc!r})") from None
        if not shapes or any(not s.ratio or min(s.ratio.values()) <= 0 or min(s.ratio) < 2 for s in shapes):
            raise EfficiencyError(f"{where}: needs at least one shape, each with positive ratios for counts >= 2")
        return cls(shapes, str(doc.get("device", "")), str(doc.get("dtype", "")))


def load(path: str | Path) -> ChunkEfficiency:
    """The ``chunk_efficiency`` table of a device check's JSON (or of a file holding the table alone)."""
    doc = device_measurements.section(path, "chunk_efficiency", EfficiencyError)
    return ChunkEfficiency.from_dict(doc, where=f"{path}: chunk_efficiency")


def configured() -> ChunkEfficiency | None:
    """The table the file named by :data:`ENV` holds, if set (read once per process and path)."""
    return device_measurements.configured(ENV, load)


@dataclass(frozen=True)
class ChunkedMatmul:
    """A matmul cost curve with the device's chunk penalty: ``rows`` of ``m`` cost
    ``ratio(m/rows) * whole(m) * rows/m`` (the whole product's cost shared out, times the penalty of
    cutting it that fine).  A :class:`~coc_shared.cost_curves.CostCurve` for the pipeline model."""

    whole: Any  # a CostCurve: the unchunked matmul time of a row count
    m: int
    k: int
    n: int
    efficiency: ChunkEfficiency

    def __call__(self, rows: float) -> float:
        if rows <= 0:
            return 0.0
        return self.efficiency.ratio(self.m / rows, self.m, self.k, self.n) * float(self.whole(self.m)) * rows / self.m

    def solve(self, t: float) -> float:
        """Smallest row count reaching ``t`` (bisection: the curve rises with the rows)."""
        lo, hi = 0.0, float(self.m)
        if self(hi) < t:
            return float(self.whole.solve(t))
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self(mid) < t else (lo, mid)
        return hi


def chunked_matmul(whole: Any, m: int, k: int, n: int,
                   efficiency: ChunkEfficiency | None = None) -> Any:
    """``whole`` with the chunk penalty of ``efficiency`` (default: :func:`configured`; none: ``whole``)."""
    table = efficiency if efficiency is not None else configured()
    return whole if table is None else ChunkedMatmul(whole, m, k, n, table)
