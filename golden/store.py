"""Manifest and checksummed loader for the stored goldens.

Loading never regenerates: a case absent from the manifest or a missing file is a
``GoldenMissingError``; a checksum, schema or tensor mismatch is a
``GoldenIntegrityError``. Both name the fix (``python -m golden.generate``) so a
stale store is an explicit decision, not a silent one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
DATA_DIR = "data"
DEFAULT_ROOT = Path(__file__).resolve().parent


class GoldenError(Exception):
    """Base of every golden-store error."""


class GoldenMissingError(GoldenError, LookupError):
    """A case is not in the manifest, or its data file is absent."""


class GoldenIntegrityError(GoldenError):
    """Stored data does not match the manifest (checksum, schema, tensors)."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class GoldenCase:
    """One loaded case: seeded inputs (already rounded to ``dtype``) and float64 outputs.

    ``params`` are the catalogue parameters recorded in the manifest; ``tensor_dtypes``
    maps each tensor to its logical dtype (the case dtype for float inputs, ``int8``
    for quantised weights, ``float64`` for outputs). Arrays are read-only because
    loaded cases are shared per process.
    """

    id: str
    kind: str
    params: Mapping[str, Any]
    seed: int
    checks: tuple[str, ...]
    inputs: Mapping[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]
    tensor_dtypes: Mapping[str, str]

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.params["dtype"])

    def tensor(self, name: str, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
        """A fresh (writable) tensor, by default in the tensor's logical dtype; exact
        for inputs because they were stored after rounding to that dtype."""
        import torch

        array = self.inputs.get(name, self.outputs.get(name))
        if array is None:
            raise KeyError(f"golden case {self.id!r} has no tensor {name!r}; "
                           f"inputs {sorted(self.inputs)}, outputs {sorted(self.outputs)}")
        target = dtype if dtype is not None else getattr(torch, self.tensor_dtypes[name])
        return torch.from_numpy(array.copy()).to(device=device, dtype=target)


class Store:
    """A golden store rooted at a directory holding ``manifest.json`` and ``data/``."""

    def __init__(self, root: Path | str = DEFAULT_ROOT) -> None:
        self.root = Path(root)
        self._cache: dict[str, GoldenCase] = {}
        self._lock = threading.Lock()

    @cached_property
    def manifest(self) -> dict[str, Any]:
        path = self.root / MANIFEST
        if not path.is_file():
            raise GoldenMissingError(f"no golden manifest at {path}; run `python -m golden.generate`")
        try:
            manifest = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise GoldenIntegrityError(f"golden manifest {path} is not valid JSON: {exc}") from exc
        if manifest.get("schema_version") != SCHEMA_VERSION:
            raise GoldenIntegrityError(f"golden manifest {path} has schema "
                                       f"{manifest.get('schema_version')!r}, loader expects {SCHEMA_VERSION}")
        return manifest

    def entry(self, case_id: str) -> dict[str, Any]:
        try:
            return self.manifest["cases"][case_id]
        except KeyError:
            raise GoldenMissingError(f"golden case {case_id!r} is not in {self.root / MANIFEST}; "
                                     "run `python -m golden.generate`") from None

    def load(self, case_id: str) -> GoldenCase:
        """Load (once per store) and verify one case against the manifest."""
        with self._lock:
            if case_id not in self._cache:
                self._cache[case_id] = self._read(case_id)
            return self._cache[case_id]

    def _read(self, case_id: str) -> GoldenCase:
        entry = self.entry(case_id)
        path = self.root / entry["file"]
        if not path.is_file():
            raise GoldenMissingError(f"golden file {path} for case {case_id!r} is missing; "
                                     "run `python -m golden.generate`")
        digest = sha256(path)
        if digest != entry["sha256"]:
            raise GoldenIntegrityError(f"golden file {path} has sha256 {digest}, manifest says "
                                       f"{entry['sha256']}; restore it, or regenerate deliberately with "
                                       "`python -m golden.generate`")
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        specs = entry["tensors"]
        if set(arrays) != set(specs):
            raise GoldenIntegrityError(f"golden file {path} holds tensors {sorted(arrays)}, "
                                       f"manifest says {sorted(specs)}")
        for name, array in arrays.items():
            want = specs[name]
            if list(array.shape) != want["shape"] or array.dtype.name != want["stored_dtype"]:
                raise GoldenIntegrityError(
                    f"golden tensor {case_id}/{name} is {array.dtype.name}{list(array.shape)}, "
                    f"manifest says {want['stored_dtype']}{want['shape']}")
            array.flags.writeable = False
        by_role = {role: MappingProxyType({n: a for n, a in arrays.items() if specs[n]["role"] == role})
                   for role in ("input", "output")}
        return GoldenCase(
            id=case_id, kind=entry["kind"], params=MappingProxyType(dict(entry["params"])),
            seed=entry["seed"], checks=tuple(entry["checks"]),
            inputs=by_role["input"], outputs=by_role["output"],
            tensor_dtypes=MappingProxyType({n: s["dtype"] for n, s in specs.items()}))


#: Environment variable naming another store root (a copy under test, a regenerated store).
ROOT_ENV = "COC_GOLDEN_DIR"


@functools.cache
def default_store() -> Store:
    """The store shipped inside the package (or at ``$COC_GOLDEN_DIR``), created on first use."""
    import os

    return Store(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def load(case_id: str) -> GoldenCase:
    """Load a case from the packaged store (verified, cached per process)."""
    return default_store().load(case_id)
