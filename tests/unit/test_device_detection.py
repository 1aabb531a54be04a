"""Device detection on a CPU-only torch asks its files, not torch (whose import would delay the ranks' fork server).

``detect_device_kind`` is the first thing to import torch in the pytest
process (``-n auto`` asks it before anything else runs); a torch built without
CUDA or ROCm has no GPU library in its ``lib`` folder, and then sees no GPU.
Any other layout, or a torch already imported, is asked by torch itself.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import torch

from conformance.harness.launchers import devices
from tests.support import ROOT


def _fake_torch(monkeypatch: pytest.MonkeyPatch, root: Path, libraries: list[str] | None) -> None:
    package = root / "torch"
    package.mkdir()
    if libraries is not None:
        (package / "lib").mkdir()
        for name in libraries:
            (package / "lib" / name).touch()
    spec = ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else real(name, *a))


@pytest.mark.parametrize(("libraries", "cpu_only"), [
    (["libtorch_cpu.so", "libc10.so"], True),
    (["libtorch_cpu.so", "libtorch_cuda.so"], False),
    (["libtorch_cpu.so", "libtorch_hip.so"], False),
    (["torch_cpu.dll", "torch_cuda.dll"], False),
    ([], False),  # a lib folder without torch's CPU library: not a layout we know
    (None, False),  # no lib folder (a source checkout): torch is asked
], ids=["cpu-wheel", "cuda-wheel", "rocm-wheel", "windows-cuda", "empty-lib", "no-lib"])
def test_only_a_torch_with_its_cpu_library_and_no_gpu_library_counts_as_cpu_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, libraries: list[str] | None, cpu_only: bool) -> None:
    _fake_torch(monkeypatch, tmp_path, libraries)
    assert devices._torch_sees_no_gpu() is cpu_only


def test_an_imported_torch_is_asked_whatever_its_files_say(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_torch(monkeypatch, tmp_path, ["libtorch_cpu.so"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices._cuda_count() == 3


@pytest.mark.skipif(not devices._torch_sees_no_gpu(), reason="the installed torch is built for GPUs")
def test_detecting_cpu_ranks_on_a_cpu_only_torch_does_not_import_torch() -> None:
    script = ("import sys\n"
              "from conformance.harness.launchers.devices import detect_device_kind\n"
              "print(detect_device_kind(4).name, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.split() == ["cpu", "False"], done.stderr
