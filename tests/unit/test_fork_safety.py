"""The rank fork server starts no device runtime before it forks (docs/DESIGN.md#fork-safety).

No NPU here, so torch_npu is a stand-in written to a temporary directory:
it records, to a file, every call that would start or query the NPU runtime
(ACL).  The fork server preloads what it always preloads, megatron-core and
the stand-in itself; then no such call happened and it serves ranks.  A
preload that sets an NPU device (the fault) makes it refuse, naming the
runtime, instead of forking ranks that could not use their devices.  The
same check asks ``torch.cuda.is_initialized()``, which only a CUDA machine
can make true.  Since torch_npu 2.5, ``import torch`` loads torch_npu through
its ``torch.backends`` entry point: stand-ins installed with one (torch_npu,
and another package registering the ``npu`` device) are loaded by the fork
server's own ``import torch``, start nothing, and an autoload that picks a
device makes the server refuse.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conformance.harness.case_errors import RankCrashed
from conformance.harness.launchers import devices
from conformance.harness.launchers.zygote import MEGATRON
from conformance.harness.launchers.zygote_client import Zygote
from tests.support import ROOT

STAND_IN = '''
"""Records every call that would start or query the NPU runtime, one JSON line each."""
import json
import os
import sys
import types

import torch

_initialized = False


def _record(name):
    with open(os.environ["NPU_CALLS"], "a") as f:
        f.write(json.dumps(name) + "\\n")


def _runtime(name, result=None):
    def call(*args, **kwargs):
        global _initialized
        _record(name)
        if name in ("_lazy_init", "init", "set_device", "_npu_init"):
            _initialized = True
        return result
    return call


npu = types.ModuleType("torch_npu.npu")
for _name, _result in (("_lazy_init", None), ("init", None), ("set_device", None), ("device_count", 1),
                       ("is_available", True), ("current_device", 0), ("synchronize", None),
                       ("get_device_name", "Ascend910B3")):
    setattr(npu, _name, _runtime(_name, _result))
npu.is_initialized = lambda: _initialized
_C = types.ModuleType("torch_npu._C")
_C._npu_init = _runtime("_npu_init")
sys.modules["torch_npu.npu"] = npu
sys.modules["torch_npu._C"] = _C
torch.npu = npu
'''

FAULT = '''
"""A preload that picks an NPU device at import time (the fault)."""
import torch_npu

torch_npu.npu.set_device(0)
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in torch_npu importable by the fork server; returns the file its calls go to."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(STAND_IN)
    (tmp_path / "sets_npu_device.py").write_text(FAULT)
    calls = tmp_path / "npu_calls.jsonl"
    calls.write_text("")
    monkeypatch.setenv("NPU_CALLS", str(calls))
    monkeypatch.syspath_prepend(str(tmp_path))  # the fork server's PYTHONPATH is this process's sys.path
    return calls


def _calls(path: Path) -> list[str]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_fork_server_preloads_without_starting_a_device_runtime(stand_in: Path) -> None:
    zygote = Zygote()
    try:
        zygote.ready(preload=(*MEGATRON, "torch_npu"))
        assert zygote.alive
    finally:
        zygote.close()
    assert _calls(stand_in) == []


def test_the_fork_server_refuses_when_a_preload_starts_the_npu_runtime(stand_in: Path) -> None:
    zygote = Zygote()
    with pytest.raises(RankCrashed, match=r"refusing to fork ranks: .*started the NPU runtime"):
        zygote.ready(preload=("sets_npu_device",))
    zygote.close()
    assert _calls(stand_in) == ["set_device"]


#: An NPU backend loaded by torch at ``import torch`` through its ``torch.backends`` entry point (torch_npu 2.5+),
#: as torch_npu itself (the stand-in above) or as another package registering the PrivateUse1 device ``npu``.
AUTOLOADED = {
    "torch_npu": STAND_IN,
    "npu_backend_stand_in": '''
"""Another package's NPU: registers torch's PrivateUse1 device as ``npu`` and ``torch.npu``, recording runtime calls."""
import json
import os
import types

import torch

_initialized = False


def _record(name):
    with open(os.environ["NPU_CALLS"], "a") as f:
        f.write(json.dumps(name) + "\\n")


def set_device(index):
    global _initialized
    _record("set_device")
    _initialized = True


npu = types.ModuleType("npu_backend_stand_in.npu")
npu.set_device = set_device
npu.is_initialized = lambda: _initialized
torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)
''',
}
AUTOLOAD_ENTRY = '''

def _autoload():
    """torch's entry point; only records that it ran (in which process), unless told to pick a device (the fault)."""
    _record(f"autoload in {os.getpid()}")
    if os.environ.get("NPU_STAND_IN_AUTOLOAD_SETS_DEVICE"):
        npu.set_device(0)
'''


@pytest.fixture(params=sorted(AUTOLOADED))
def autoloaded(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An NPU backend installed with a ``torch.backends`` entry point where the fork server imports from; returns
    the file its calls go to."""
    package = request.param
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(AUTOLOADED[package] + AUTOLOAD_ENTRY)
    info = tmp_path / f"{package}-2.13.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 2.13.0\n")
    info.joinpath("entry_points.txt").write_text(f"[torch.backends]\n{package} = {package}:_autoload\n")
    calls = tmp_path / "npu_calls.jsonl"
    calls.write_text("")
    monkeypatch.setenv("NPU_CALLS", str(calls))
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return calls


def test_an_npu_backend_autoloaded_at_import_torch_is_in_the_fork_server_and_starts_no_runtime(
        autoloaded: Path) -> None:
    zygote = Zygote()
    try:
        zygote.ready(preload=())
        assert zygote.alive
    finally:
        zygote.close()
    seen = _calls(autoloaded)
    assert len(seen) == 1 and seen[0].startswith("autoload in ") and seen[0] != f"autoload in {os.getpid()}"


def test_the_fork_server_refuses_when_an_autoloaded_npu_backend_started_its_runtime(
        autoloaded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_STAND_IN_AUTOLOAD_SETS_DEVICE", "1")
    zygote = Zygote()
    try:
        with pytest.raises(RankCrashed, match=r"refusing to fork ranks: .*started the (NPU|npu) runtime"):
            zygote.ready(preload=())
    finally:
        zygote.close()
    assert _calls(autoloaded)[1:] == ["set_device"]


def test_the_pytest_process_counts_npus_and_names_them_without_starting_acl(
        stand_in: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The visibility variable where it is set, else a subprocess asks torch_npu: never this process."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(stand_in.parent), str(ROOT)]))
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    devices._runtime_probe.cache_clear()
    try:
        assert devices._npu_count() == 1
        kind = devices.DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", 1)
        assert devices.node_identity(kind) == {"device": "npu", "name": "Ascend910B3", "backend": "hccl"}
        assert "torch_npu" not in sys.modules
        assert _calls(stand_in) == ["device_count", "get_device_name"]  # made once, by the subprocess
        monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5")
        assert devices._npu_count() == 2
    finally:
        devices._runtime_probe.cache_clear()


def test_a_rank_binds_its_device_before_its_group_and_a_cpu_rank_binds_none(
        stand_in: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL and HCCL bind a communicator to the current device: the rank makes its own device current first
    (torch_npu imported in the rank, after the fork); a CPU rank touches no runtime."""
    import subprocess

    import torch


    chosen: list[object] = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    devices.bind_device("cpu")
    devices.bind_device("cuda:1")
    assert chosen == ["cuda:1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", "from conformance.harness.launchers.devices import bind_device; "
                    "bind_device('npu:3')"], check=True, env=env, cwd=ROOT)
    assert _calls(stand_in) == ["set_device"]
