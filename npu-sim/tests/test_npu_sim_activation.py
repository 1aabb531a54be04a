"""Switching the emulator on: the torch.backends entry point with and without NPU_SIM=1, the torch_npu
facade, and the refusal to shadow a real torch_npu."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import importlib, sys
    import torch
    print("npu module:", hasattr(torch, "npu") and torch.npu.__name__)
    try:
        torch_npu = importlib.import_module("torch_npu")
        print("torch_npu:", torch_npu.__version__, torch_npu.npu is torch.npu)
        print("device:", torch.ones(1, device="npu").device)
    except ImportError as error:
        print("torch_npu:", type(error).__name__)
""")


def _python(code: str, **env: str | None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("NPU_SIM") and key != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    environment.update({key: value for key, value in env.items() if value is not None})
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


def test_import_torch_meets_the_node_with_npu_sim_set():
    done = _python(PROBE, NPU_SIM="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["npu module: npu_sim.npu", "torch_npu: 2.13.0+npusim True",
                                        "device: npu:0"]


def test_import_torch_is_untouched_without_it():
    for value in (None, "0"):
        done = _python(PROBE, NPU_SIM=value)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["npu module: False", "torch_npu: ModuleNotFoundError"]


def test_a_real_torch_npu_is_never_shadowed(tmp_path):
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('a real torch_npu would load CANN here')\n")
    done = _python("import torch", NPU_SIM="1", PYTHONPATH=str(tmp_path))
    assert done.returncode != 0
    assert "Failed to load the backend extension: npu_sim" in done.stderr
    assert "a real torch_npu is installed" in done.stderr and "npu-sim never shadows it" in done.stderr
