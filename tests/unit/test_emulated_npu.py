"""``--coc-emulate-npu`` (docs/DESIGN.md#the-emulated-npu-node): the emulated Ascend node, switched on for the session
and every process it starts, seen by device detection without importing torch, and refused where it cannot be."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conformance.harness.launchers import npu_emulation
from tests.support import ROOT

#: Detection after the option's switch, in a fresh process: the node it sees, and whether torch was imported for it.
DETECT = ("import json, os, sys\n"
          "from conformance.harness.launchers import devices, npu_emulation\n"
          "npu_emulation.emulate_npu()\n"
          "kind = devices.detect_device_kind(4)\n"
          "print(json.dumps({'kind': [kind.name, kind.backend, kind.count, kind.visibility_var,\n"
          "                           kind.computes_on_host],\n"
          "                  'identity': devices.node_identity(kind), 'torch': 'torch' in sys.modules,\n"
          "                  'NPU_SIM': os.environ.get('NPU_SIM')}))")


def _detect(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NPU_SIM", "ASCEND_"))}
    done = subprocess.run([sys.executable, "-c", DETECT], capture_output=True, text=True, cwd=ROOT,
                          env={**clean, **env}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_option_shows_detection_the_emulated_node_without_importing_torch() -> None:
    seen = _detect()
    assert seen == {"kind": ["npu", "hccl", 8, "ASCEND_RT_VISIBLE_DEVICES", True],  # its devices are the host's
                    "identity": {"device": "npu-sim", "name": "Ascend910B3", "backend": "hccl"},
                    "torch": False, "NPU_SIM": "1"}  # NPU_SIM=1: every process started from here meets the node


def test_the_emulated_node_is_the_one_its_settings_describe() -> None:
    seen = _detect(NPU_SIM_CARDS="16", NPU_SIM_SOC="Ascend910_9391", ASCEND_RT_VISIBLE_DEVICES="4,5,6,7")
    assert seen["kind"] == ["npu", "hccl", 4, "ASCEND_RT_VISIBLE_DEVICES", True]
    assert seen["identity"]["name"] == "Ascend910_9391"


def _refused(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    return pytester.runpytest("-p", "conformance.plugin", "--coc-emulate-npu")


def test_the_option_is_a_usage_error_where_npu_sim_is_not_installed(pytester: pytest.Pytester,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPU_SIM", raising=False)
    real = npu_emulation.importable
    monkeypatch.setattr(npu_emulation, "importable", lambda name: False if name == "npu_sim" else real(name))
    result = _refused(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--coc-emulate-npu: the emulated NPU node needs npu-sim, which is not installed*"])
    assert "NPU_SIM" not in os.environ


def test_the_option_is_a_usage_error_where_a_real_torch_npu_is_installed(pytester: pytest.Pytester,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPU_SIM", raising=False)
    monkeypatch.setattr(npu_emulation, "real_torch_npu", lambda: "/opt/site-packages/torch_npu/__init__.py")
    result = _refused(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--coc-emulate-npu: a real torch_npu is installed "
                                 "(/opt/site-packages/torch_npu/__init__.py)*never the emulated node*"])
    assert "NPU_SIM" not in os.environ


def test_a_setting_the_emulated_node_does_not_take_is_a_usage_error(pytester: pytest.Pytester,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPU_SIM", raising=False)
    monkeypatch.setenv("NPU_SIM_SOC", "Ascend310P")
    result = _refused(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--coc-emulate-npu: NPU_SIM_SOC='Ascend310P'*"])


def test_npu_sim_installed_is_never_the_emulated_node_without_asking() -> None:
    """Installed beside the suite (as tox installs it), npu-sim changes nothing until the option or NPU_SIM=1."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NPU_SIM")}
    script = ("import sys\nfrom conformance.harness.launchers import devices, npu_emulation\n"
              "print(devices.detect_device_kind(4).name, npu_emulation.emulated_npu(), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=clean,
                          check=True)
    assert done.stdout.split() == ["cpu", "False", "False"], done.stderr


def _rank_identity() -> dict:
    from types import SimpleNamespace

    from conformance.cases.perf_cases import device_identity

    return device_identity(SimpleNamespace(device="npu:0", world_size=8), "hccl")  # type: ignore[arg-type]


def test_no_hardware_profile_is_the_emulated_nodes() -> None:
    """The emulated node's device is the host's CPU: its identity is npu-sim on both sides, so a profile measured
    on Ascend hardware (npu-910b-tp8 matched its Ascend910B3, and enforced MC2's gains on CPU timings) never runs
    there; it reports figures under the figures-only profile."""
    from npu_sim.testing import in_npu_process

    from conformance.judge import hardware

    seen = _detect()
    rank = in_npu_process(_rank_identity, env={"NPU_SIM": "1"})
    assert seen["identity"]["device"] == rank["device"] == "npu-sim" and rank["name"] == "Ascend910B3"
    assert hardware.node_profile(seen["identity"]) is None
    assert hardware.matching_profile(**rank) is None
    assert hardware.why_not_here(hardware.by_name("unprofiled"), seen["identity"], 8) == ""
    real = {**seen["identity"], "device": "npu"}
    assert hardware.node_profile(real).name == "npu-910b-tp8"  # the same SoC's name, on hardware
