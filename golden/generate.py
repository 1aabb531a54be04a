"""Explicit generator and verifier of the golden store.

``python -m golden.generate`` rebuilds every catalogue case from its seed and
rewrites only the files whose content changed (``--force`` rewrites all), then the
manifest. ``python -m golden.generate --check`` writes nothing: it verifies every
file against the manifest and recomputes every case to prove the store is
reproducible from its seeds. Inputs must match bit for bit; float64 outputs
within ``REPRO_RTOL`` (BLAS summation order may differ between machines).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from golden import serial
from golden.catalogue import CATALOGUE, Case, LayerCase, OpCase, QuantCase
from golden.store import (
    DATA_DIR,
    DEFAULT_ROOT,
    MANIFEST,
    SCHEMA_VERSION,
    GoldenCase,
    GoldenError,
    Store,
    sha256,
)

GENERATOR_VERSION = "2"
RNG = "numpy.random.default_rng(seed) (PCG64)"
REPRO_RTOL = 1e-12
_INT8_STD = 74.0  # std of uniform int8: keeps dequantised weights ~ N(0, 1/k)

CONVENTIONS = {
    "layer_weight": "Megatron [out, in]; y = x @ w.T + b",
    "op_weight": "[k, n]; y = x @ w + bias",
    "gelu": f"exact {serial.GELU} GELU (not tanh)",
    "dequant": "(w + offset) * scale; per-group row i uses group i // g",
    "inputs": "seeded, rounded to the case dtype, stored as float32 (int8 weights as int8)",
    "outputs": "float64, computed from the rounded inputs",
}


@dataclass(frozen=True)
class Built:
    """A case's arrays as stored, plus each tensor's logical dtype."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    dtypes: dict[str, str]


def _inputs(case: Case) -> dict[str, Tensor]:
    """Seeded float64 inputs, already rounded to the case dtype (int8 weights stay int8)."""
    rng = np.random.default_rng(case.seed)
    dtype = getattr(torch, case.dtype)

    def draw(*shape: int, std: float = 1.0) -> Tensor:
        return (torch.from_numpy(rng.standard_normal(shape)) * std).to(dtype).double()

    if isinstance(case, LayerCase):
        s, b, h_in, h_out = case.s, case.b, case.h_in, case.h_out
        t = {"x": draw(s, b, h_in)}
        if case.layer == "mlp":
            assert case.ffn is not None
            t["w1"] = draw(case.ffn, h_in, std=h_in ** -0.5)
            if case.with_bias:
                t["b1"] = draw(case.ffn, std=0.5)
            t["w2"] = draw(h_out, case.ffn, std=case.ffn ** -0.5)
            if case.with_bias:
                t["b2"] = draw(h_out, std=0.5)
        else:
            t["w"] = draw(h_out, h_in, std=h_in ** -0.5)
            if case.with_bias:
                t["b"] = draw(h_out, std=0.5)
        t["dy"] = draw(s, b, h_out)
        return t
    t = {"x": draw(case.m, case.k)}
    if isinstance(case, OpCase):
        t["w"] = draw(case.k, case.n, std=case.k ** -0.5)
    else:
        t["w"] = torch.from_numpy(rng.integers(-128, 128, (case.k, case.n), dtype=np.int8))
        shape = case.scale_shape
        t["scale"] = (torch.from_numpy(rng.uniform(0.5, 1.5, shape))
                      / (_INT8_STD * math.sqrt(case.k))).to(dtype).double()
        if case.with_offset:
            # Zero points of asymmetric int8 quantisation: whole numbers well inside int8.
            t["offset"] = torch.from_numpy(rng.integers(-64, 65, shape).astype(np.float64))
    if case.with_bias:
        t["bias"] = draw(case.n, std=0.5)
    return t


def _outputs(case: Case, t: dict[str, Tensor]) -> dict[str, Tensor]:
    """The float64 serial results of one case, by stored name."""
    if isinstance(case, LayerCase):
        if case.layer == "mlp":
            grads = serial.mlp_forward_backward(t["x"], t["w1"], t.get("b1"), t["w2"],
                                                t.get("b2"), t["dy"])._asdict()
        else:
            grads = serial.linear_forward_backward(t["x"], t["w"], t.get("b"), t["dy"])._asdict()
        return {name: g for name, g in grads.items() if g is not None}
    if isinstance(case, QuantCase):
        return {"y": serial.quant_matmul_all_reduce(t["x"], t["w"], t["scale"], t.get("offset"),
                                                    t.get("bias"), case.group_size)}
    return {"y": serial.matmul(t["x"], t["w"], t.get("bias"))}


def build(case: Case) -> Built:
    """Recompute one case from its seed, in storage form."""
    inputs = _inputs(case)
    outputs = _outputs(case, inputs)
    dtypes = {n: ("int8" if v.dtype == torch.int8 else case.dtype) for n, v in inputs.items()}
    dtypes |= {n: "float64" for n in outputs}
    return Built(
        inputs={n: v.numpy() if v.dtype == torch.int8 else v.float().numpy() for n, v in inputs.items()},
        outputs={n: v.numpy() for n, v in outputs.items()},
        dtypes=dtypes)


def _entry(case: Case, built: Built) -> dict[str, Any]:
    """The manifest entry of a case, without its checksum."""
    tensors = {n: {"role": role, "shape": list(a.shape), "stored_dtype": a.dtype.name,
                   "dtype": built.dtypes[n]}
               for role, arrays in (("input", built.inputs), ("output", built.outputs))
               for n, a in arrays.items()}
    return {"kind": case.kind, "params": case.params, "seed": case.seed, "checks": list(case.checks),
            "file": f"{DATA_DIR}/{case.id}.npz", "tensors": tensors}


def _difference(stored: GoldenCase, built: Built) -> str | None:
    """Why stored arrays differ from a recomputation, or None if they agree."""
    for name, want in built.inputs.items():
        got = stored.inputs.get(name)
        if got is None or got.dtype != want.dtype or not np.array_equal(got, want):
            return f"input {name!r} differs from its seeded recomputation"
    for name, want in built.outputs.items():
        got = stored.outputs.get(name)
        if got is None or got.shape != want.shape or not np.allclose(
                got, want, rtol=REPRO_RTOL, atol=REPRO_RTOL * max(1.0, float(np.abs(want).max()))):
            return f"output {name!r} differs from its float64 recomputation"
    return None


def _stale(store: Store, case: Case, built: Built) -> str | None:
    """Why a stored case is not this recomputation (missing, corrupt, changed), or None."""
    try:
        entry = store.entry(case.id)
        stored = store.load(case.id)
    except GoldenError as exc:
        return str(exc)
    if {k: v for k, v in entry.items() if k != "sha256"} != json.loads(json.dumps(_entry(case, built))):
        return "manifest entry differs from the catalogue"
    return _difference(stored, built)


def _orphans(root: Path, ids: set[str]) -> list[Path]:
    return sorted(p for p in (root / DATA_DIR).glob("*.npz") if p.stem not in ids)


def _manifest_text(cases: dict[str, Any]) -> str:
    manifest = {"schema_version": SCHEMA_VERSION, "generator_version": GENERATOR_VERSION,
                "rng": RNG, "conventions": CONVENTIONS, "cases": cases}
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def generate(root: Path = DEFAULT_ROOT, force: bool = False) -> list[str]:
    """Write changed (or, with ``force``, all) cases and the manifest; return written ids."""
    store, written, cases = Store(root), [], {}
    (root / DATA_DIR).mkdir(parents=True, exist_ok=True)
    for case in CATALOGUE:
        built = build(case)
        entry = _entry(case, built)
        path = root / entry["file"]
        if force or _stale(store, case, built):
            arrays: dict[str, Any] = built.inputs | built.outputs
            np.savez_compressed(path, **arrays)
            written.append(case.id)
        cases[case.id] = entry | {"sha256": sha256(path)}
    for orphan in _orphans(root, set(cases)):
        orphan.unlink()
    (root / MANIFEST).write_text(_manifest_text(cases))
    return written


def check(root: Path = DEFAULT_ROOT) -> list[str]:
    """Every problem of the store at ``root``; empty means verified and reproducible."""
    store = Store(root)
    try:
        manifest = store.manifest
    except GoldenError as exc:
        return [str(exc)]
    problems = []
    if manifest.get("generator_version") != GENERATOR_VERSION:
        problems.append(f"manifest generator_version {manifest.get('generator_version')!r} "
                        f"!= {GENERATOR_VERSION!r}")
    problems += [f"{case.id}: {why}" for case in CATALOGUE
                 if (why := _stale(store, case, build(case)))]
    ids = {case.id for case in CATALOGUE}
    problems += [f"{cid}: in the manifest but not in the catalogue"
                 for cid in sorted(set(manifest["cases"]) - ids)]
    problems += [f"{p}: file not in the catalogue" for p in _orphans(root, ids)]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m golden.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="verify and recompute; write nothing")
    parser.add_argument("--force", action="store_true", help="rewrite every case file")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="store directory")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.root)
        for problem in problems:
            print(f"FAIL {problem}", file=sys.stderr)
        print(f"{len(CATALOGUE)} cases, {len(problems)} problem(s)")
        return 1 if problems else 0
    written = generate(args.root, force=args.force)
    print(f"{len(CATALOGUE)} cases, {len(written)} written to {args.root / DATA_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
