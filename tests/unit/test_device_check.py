"""The device check's pieces on CPU (docs/DESIGN.md#the-device-check): the sessions it runs on an accelerator, the
parts a CPU records as not run, the GEMM rows measurement it hands the reference, and the verdicts of its device
hang cases."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import pytest

from coc_shared import gemm_rows
from conformance.bench import device, gemm_measurements, hangs
from conformance.contract.rank_errors import CapturedError
from conformance.harness.case import Budget, RankOutcome
from conformance.harness.case_errors import CaseTimeout, RankCrashed
from conformance.harness.launchers.devices import DeviceKind, cpu, shared
from tests.support import ROOT

ONE_GPU = DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES", 1)


def _npus(count: int) -> DeviceKind:
    return DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", count)


def test_on_an_accelerator_it_runs_the_whole_suite_at_tp_2_to_8_sharing_the_device_and_explores_at_tp_2(
        tmp_path: Path) -> None:
    sessions = device.sessions(ONE_GPU, tmp_path, 60.0)
    assert set(sessions) == {"suite", "explore", "shared"}
    shared, _, limit = sessions["shared"]
    assert shared[shared.index("--coc-ranks-per-device") + 1] == "8" and shared[shared.index("--coc-tp") + 1] == "2,4,8"
    assert shared[shared.index("-m") + 1] == "not perf" and limit <= 600
    explore = sessions["explore"][0]
    assert explore[explore.index("--coc-tp") + 1] == "2" and "--coc-ranks-per-device" in explore  # one device
    assert "--coc-ranks-per-device" not in device.sessions(DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES", 2),
                                                           tmp_path, 60.0)["explore"][0]
    assert set(device.sessions(cpu(), tmp_path, 60.0)) == {"suite", "explore"}


@pytest.mark.parametrize("kind", [_npus(8), _npus(4), _npus(1), ONE_GPU, DeviceKind("cuda", "nccl",
                                  "CUDA_VISIBLE_DEVICES", 2), cpu()],
                         ids=["8-npu", "4-npu", "1-npu", "1-gpu", "2-gpu", "cpu"])
def test_every_session_it_plans_is_one_the_suite_accepts_on_that_node(kind: DeviceKind, tmp_path: Path) -> None:
    """Ranks share a device only where the suite lets them (GPUs, over gloo): the suite refuses
    --coc-ranks-per-device on an NPU (a usage error, exit 1), and a TP larger than the node is never asked."""
    for args, _, _ in device.sessions(kind, tmp_path, 60.0).values():
        if "--coc-ranks-per-device" in args:
            shared(kind, int(args[args.index("--coc-ranks-per-device") + 1]))  # raises where it is refused
            continue
        assert all(int(tp) <= kind.count for tp in args[args.index("--coc-tp") + 1].split(","))


def test_on_npus_it_runs_tp_2_to_8_one_rank_per_card(tmp_path: Path) -> None:
    planned = device.sessions(_npus(8), tmp_path, 60.0)
    assert set(planned) == {"suite", "explore", "tp"}
    tp = planned["tp"][0]
    assert tp[tp.index("--coc-tp") + 1] == "2,4,8" and tp[tp.index("-n") + 1] == "4" and "not perf" in tp
    tp = device.sessions(_npus(4), tmp_path, 60.0)["tp"][0]
    assert tp[tp.index("--coc-tp") + 1] == "2,4" and tp[tp.index("-n") + 1] == "2"
    one = device.sessions(_npus(1), tmp_path, 60.0)
    assert set(one) == {"suite", "explore"}
    assert one["explore"][0][one["explore"][0].index("--coc-tp") + 1] == "1"


@pytest.mark.parametrize("kind, part, why", [
    (_npus(8), "shared", "HCCL takes one rank per card"),
    (_npus(1), "tp", "one npu card"),
    (ONE_GPU, "tp", "the shared part runs TP 2,4,8"),
])
def test_a_part_the_node_cannot_run_is_recorded_as_not_run(
        kind: DeviceKind, part: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "detect_device_kind", lambda: kind)
    monkeypatch.setattr(device, "node_identity", lambda k: {"device": k.name, "name": "?", "backend": k.backend})
    out = tmp_path / "device-check.json"
    assert device.main(["--only", part, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc[part]["ran"] is False and why in doc[part]["why"]


@pytest.mark.parametrize("found, variables, why", [
    ("davinci0", {}, "this node has npu devices (DEV/davinci0) but this Python sees none"),
    ("nvidia0", {}, "this node has cuda devices (DEV/nvidia0) but this Python sees none"),
    (None, {"NPU_SIM": "1"}, "NPU_SIM=1 asks for the emulated NPU node, but this Python sees no NPU"),
])
def test_a_node_whose_accelerators_this_python_cannot_see_fails_instead_of_measuring_the_cpu(
        found: str | None, variables: dict[str, str], why: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    if found:
        (dev / found).touch()
    monkeypatch.setattr(device, "DEV", dev)
    monkeypatch.delenv("NPU_SIM", raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(device, "detect_device_kind", lambda: cpu())
    out = tmp_path / "device-check.json"
    assert device.main(["--only", "shared", "--out", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["failed_parts"] == ["node"] and doc["error"].startswith(why.replace("DEV", str(dev)))
    assert "shared" not in doc and "measuring cpu" in capsys.readouterr().out


def test_tox_device_runs_on_the_nodes_own_torch_with_canns_environment() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    env = tox["testenv:device"]
    assert env.getboolean("system_site_packages")
    assert not any(dep.strip().startswith("torch") for dep in env["deps"].splitlines())
    passed = set(env["pass_env"].split())
    assert {"ASCEND_*", "LD_LIBRARY_PATH", "PYTHONPATH", "NPU_SIM", "HCCL_*"} <= passed


def test_on_a_cpu_the_accelerator_parts_are_recorded_as_not_run_and_the_gemm_rows_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_measurements, "CPU_ROWS", (((96, 64), (256, 256)), 512))
    monkeypatch.setattr(device, "DEV", tmp_path)
    monkeypatch.delenv("NPU_SIM", raising=False)
    monkeypatch.delenv(gemm_rows.ENV, raising=False)
    out = tmp_path / "device-check.json"
    assert device.main(["--only", "gemm_rows", "--only", "shared", "--only", "hangs", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["shared"] == {"ran": False, "why": device.NOT_ON_CPU["shared"]}
    assert doc["hangs"] == {"ran": False, "why": device.NOT_ON_CPU["hangs"]} and doc["failed_parts"] == []
    measured = gemm_rows.load(out)
    assert measured.device == "cpu" and [(s.k, s.n) for s in measured.shapes] == [(96, 64), (256, 256)]
    # What the sessions were given, and what the reference declared on it.
    assert gemm_rows.load(out.with_suffix(".parts") / "gemm-rows.json") == measured
    assert doc["gemm_rows"]["reference_claims_split_invariance"] is measured.invariant(16)


def test_a_part_fails_the_check_when_its_session_or_a_hang_verdict_failed() -> None:
    assert device.failed({"suite": {"exit_code": 0}, "explore": {"exit_code": 5}, "hangs": {"problems": []}}) == []
    assert device.failed({"suite": {"exit_code": 1}, "shared": {"exit_code": 0, "failed": ["a case"]},
                          "hangs": {"problems": ["late"]}}) == ["suite", "shared", "hangs"]
    assert device.failed({"shared": {"ran": False, "why": "cpu"}}) == []


def test_two_ranks_share_the_only_device_where_they_can() -> None:
    kind, devices = device._two_ranks(ONE_GPU)  # type: ignore[misc]
    assert kind.backend == "gloo" and kind.ranks_per_device == 2 and devices == ["0/0", "0/1"]
    assert device._two_ranks(DeviceKind("cuda", "nccl", "CUDA_VISIBLE_DEVICES", 4))[1] == ["0", "1"]  # type: ignore[index]
    assert "cannot share it" in str(device._two_ranks(DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", 1)))


def _passed() -> list[RankOutcome]:
    return [RankOutcome(rank, None, None) for rank in range(2)]


@pytest.mark.parametrize("bound_s, bound, deadlock_s, deadlock, wrong", [
    (6.0, "passed", 2.0, "timeout", ""),
    (6.0, "timeout", 2.0, "timeout", "did not count as progress"),
    (1.5, "passed", 2.0, "timeout", "proves nothing"),
    (6.0, "passed", 2.0, "crash", "not a hang"),
    (6.0, "passed", 60.0, "timeout", "an idle device was taken for progress"),
])
def test_the_device_hang_verdicts_are_held_to_the_devices_evidence(bound_s: float, bound: str, deadlock_s: float,
                                                                   deadlock: str, wrong: str) -> None:
    results = {"passed": _passed(), "timeout": CaseTimeout("no progress"), "crash": RankCrashed("rank 1 died")}
    problems = hangs.device_problems(hangs.OnDevice(1.0, hangs.Timed(bound_s, results[bound]),
                                                    hangs.Timed(deadlock_s, results[deadlock])))
    assert (wrong in " ".join(problems)) if wrong else problems == [], problems


def test_a_rank_error_in_the_device_bound_case_is_a_problem() -> None:
    outcomes = [RankOutcome(0, None, None), RankOutcome(1, None, CapturedError("RuntimeError", "boom", ""))]
    assert hangs.device_problems(hangs.OnDevice(1.0, hangs.Timed(6.0, outcomes),
                                                hangs.Timed(2.0, CaseTimeout("no progress"))))


def test_the_device_hang_cases_run_on_cpu_ranks() -> None:
    """Their code on CPU ranks, where CPU time carries the device-bound case (the device's events are the
    accelerator's: unproven here)."""
    from conformance.harness.launchers.process_launcher import ProcessLauncher

    launcher = ProcessLauncher(cpu(2), max_live_ranks=2)
    try:
        run = hangs.on_device(launcher, (), Budget(factor=20, floor=1.0), seconds=0.3, ceiling_s=60.0)
    finally:
        launcher.close()
    bound = run.bound.result
    assert isinstance(bound, list) and all(o.error is None and o.value >= 1 for o in bound), bound
    assert isinstance(run.deadlock.result, CaseTimeout), run.deadlock


#: The device hang cases on the emulated NPU node, in a fresh process (the emulator stays out of this one).
EMULATED_HANGS = ("import json\n"
                  "from conformance.bench.device import hang_evidence\n"
                  "from conformance.harness.launchers.devices import detect_device_kind\n"
                  "kind = detect_device_kind()\n"
                  "print(json.dumps({'kind': kind.name, 'on_host': kind.computes_on_host,"
                  " **hang_evidence(kind)}))")


def test_the_device_hang_verdicts_hold_on_the_emulated_npu_node(tmp_path: Path) -> None:
    """On the emulated node the device's work is the host's (its events complete at once): a rank's CPU time is its
    evidence, so the device-bound case passes (it was declared hung: 'CPU time is no evidence on a device'); the
    deadlock waits on the device's own tensor (a CPU one failed the hccl group: 'No backend type associated with
    device type cpu') and is declared at its budget."""
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("NPU_SIM", "ASCEND_", "HCCL_"))},
           "NPU_SIM": "1", "NPU_SIM_NODE_DIR": str(tmp_path / "node")}
    done = subprocess.run([sys.executable, "-c", EMULATED_HANGS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["kind"] == "npu" and seen["on_host"] and seen["ran"], seen
    assert seen["problems"] == [], seen
