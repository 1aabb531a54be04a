"""The golden store: catalogue rules, verified loading, generator check, serial maths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import golden
from golden import serial
from golden.catalogue import MAX_CHUNKS, TP_SIZES, LayerCase, OpCase, QuantCase
from golden.generate import check, generate, main
from golden.store import DEFAULT_ROOT, MANIFEST, Store, sha256

CASES = golden.catalogue()


@pytest.fixture
def store_copy(tmp_path: Path) -> Path:
    shutil.copytree(DEFAULT_ROOT / "data", tmp_path / "data")
    shutil.copy(DEFAULT_ROOT / MANIFEST, tmp_path / MANIFEST)
    return tmp_path


def test_catalogue_ids_unique_and_every_kind_present() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.kind for c in CASES} == {"layer", "op", "w8a16"}
    assert {c.layer for c in golden.catalogue("layer")} == {"column", "row", "mlp"}  # type: ignore[union-attr]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_catalogue_shapes_shard_for_every_tp_and_chunk_count(case: golden.Case) -> None:
    for tp in TP_SIZES:
        if isinstance(case, LayerCase):
            assert case.s % tp == 0 and (case.m // tp) % MAX_CHUNKS == 0
            assert all(h % tp == 0 for h in (case.h_in, case.h_out, case.ffn or tp))
        elif isinstance(case, OpCase):
            assert (case.m // tp) % MAX_CHUNKS == 0 and case.m % tp == 0 and case.k % tp == 0
        else:
            assert isinstance(case, QuantCase) and case.m % MAX_CHUNKS == 0
            if case.group_size:
                assert case.group_size % 32 == 0 and 32 <= case.group_size < case.k
                assert (case.k // tp) % case.group_size == 0


def test_manifest_matches_catalogue_and_files() -> None:
    manifest = json.loads((DEFAULT_ROOT / MANIFEST).read_text())
    assert set(manifest["cases"]) == {c.id for c in CASES}
    for case in CASES:
        entry = manifest["cases"][case.id]
        assert entry["seed"] == case.seed and entry["params"] == json.loads(json.dumps(case.params))
        assert sha256(DEFAULT_ROOT / entry["file"]) == entry["sha256"]


def test_loaded_inputs_are_exact_in_their_dtype_and_tensor_api() -> None:
    for case in CASES:
        loaded = golden.load(case.id)
        for name in loaded.inputs:
            t = loaded.tensor(name)
            assert t.dtype in (loaded.dtype, torch.int8)
            assert np.array_equal(t.double().numpy(), loaded.inputs[name])  # no rounding on load
        for name in loaded.outputs:
            assert loaded.tensor(name).dtype == torch.float64
    loaded = golden.load(CASES[0].id)
    assert golden.load(CASES[0].id) is loaded  # cached per process
    t = loaded.tensor("x", dtype=torch.float64)
    t.zero_()  # a fresh copy: the cached case is untouched
    assert np.abs(loaded.inputs["x"]).max() > 0
    with pytest.raises(KeyError, match="no tensor"):
        loaded.tensor("nope")


def test_tampered_file_raises_integrity_error(store_copy: Path) -> None:
    path = store_copy / "data" / f"{CASES[0].id}.npz"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(golden.GoldenIntegrityError, match="sha256"):
        Store(store_copy).load(CASES[0].id)


def test_missing_file_case_or_manifest_raises_missing_error(store_copy: Path) -> None:
    (store_copy / "data" / f"{CASES[0].id}.npz").unlink()
    with pytest.raises(golden.GoldenMissingError, match="missing"):
        Store(store_copy).load(CASES[0].id)
    with pytest.raises(golden.GoldenMissingError, match="not in"):
        Store(store_copy).load("no-such-case")
    (store_copy / MANIFEST).unlink()
    with pytest.raises(golden.GoldenMissingError, match="manifest"):
        Store(store_copy).load(CASES[1].id)


def test_check_passes_on_the_shipped_store() -> None:
    assert main(["--check"]) == 0


def test_check_detects_a_wrong_value_with_a_valid_checksum(store_copy: Path) -> None:
    case_id = golden.catalogue("op")[0].id
    path = store_copy / "data" / f"{case_id}.npz"
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays["y"][3, 5] += 1e-6
    np.savez_compressed(path, **arrays)
    manifest = json.loads((store_copy / MANIFEST).read_text())
    manifest["cases"][case_id]["sha256"] = sha256(path)
    (store_copy / MANIFEST).write_text(json.dumps(manifest))

    Store(store_copy).load(case_id)  # checksum is fine, only recomputation can tell
    problems = check(store_copy)
    assert len(problems) == 1 and case_id in problems[0] and "'y'" in problems[0]
    assert generate(store_copy) == [case_id]  # regenerating rewrites only the changed case
    assert check(store_copy) == []


def _autograd(fn, *tensors: torch.Tensor | None, dy: torch.Tensor) -> list[torch.Tensor | None]:
    leaves = [t.clone().requires_grad_() if t is not None else None for t in tensors]
    y = fn(*leaves)
    y.backward(dy)
    return [y.detach()] + [t.grad if t is not None else None for t in leaves]


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_and_mlp_match_autograd(with_bias: bool) -> None:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x, w, dy = rand(4, 3, 8), rand(5, 8), rand(4, 3, 5)
    b = rand(5) if with_bias else None
    y, dx, dw, db = _autograd(F.linear, x, w, b, dy=dy)
    got = serial.linear_forward_backward(x, w, b, dy)
    for have, want in zip(got, (y, dx, dw, db)):
        assert (have is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)

    w1, w2, dy = rand(16, 8), rand(5, 16), rand(4, 3, 5)
    b1, b2 = (rand(16), rand(5)) if with_bias else (None, None)

    def mlp(x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
        return F.linear(F.gelu(F.linear(x, w1, b1), approximate="none"), w2, b2)

    y, dx, dw1, db1, dw2, db2 = _autograd(mlp, x, w1, b1, w2, b2, dy=dy)
    got_mlp = serial.mlp_forward_backward(x, w1, b1, w2, b2, dy)
    for have, want in zip(got_mlp, (y, dx, dw1, db1, dw2, db2)):
        assert (have is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)


def test_matmul_is_the_plain_product() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    bias = torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64)
    want = torch.tensor([[1.5, 2.0, 1.0], [3.5, 4.0, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(serial.matmul(x, w, bias), want, rtol=0, atol=0)


W_INT8 = torch.tensor([[1, -2], [3, 4], [-5, 6]], dtype=torch.int8)  # k=3, n=2


@pytest.mark.parametrize("scale, offset, group_size, want", [
    ([2.0], None, None, [[2, -4], [6, 8], [-10, 12]]),
    ([2.0], [1.0], None, [[4, -2], [8, 10], [-8, 14]]),
    ([1.0, 0.5], None, None, [[1, -1], [3, 2], [-5, 3]]),
    ([1.0, 0.5], [0.0, 2.0], None, [[1, 0], [3, 3], [-5, 4]]),
    # g=2 over k=3: rows 0-1 use group 0, row 2 the (partial) group 1.
    ([[1.0, 2.0], [10.0, 0.5]], None, 2, [[1, -4], [3, 8], [-50, 3]]),
    ([[1.0, 2.0], [10.0, 0.5]], [[1.0, 0.0], [0.5, -6.0]], 2, [[2, -4], [4, 8], [-45, 0]]),
])
def test_dequantize_hand_examples(scale, offset, group_size, want) -> None:  # type: ignore[no-untyped-def]
    def f64(values):  # type: ignore[no-untyped-def]
        return None if values is None else torch.tensor(values, dtype=torch.float64)

    got = serial.dequantize(W_INT8, f64(scale), f64(offset), group_size)
    torch.testing.assert_close(got, f64(want), rtol=0, atol=0)


def test_dequantize_rejects_a_wrong_group_count() -> None:
    with pytest.raises(ValueError, match="per-group"):
        serial.dequantize(W_INT8, torch.ones(1, 2, dtype=torch.float64), group_size=2)
