"""The MindSpeed adapter (``conformance/adapters/mindspeed/``) against a real MindSpeed checkout.

Without MindSpeed (``MINDSPEED_SRC`` unset or not a checkout) only the tests of
that refusal run; the rest skip, saying why.  With it:

* unit tests, from one fresh interpreter (:func:`probe`): loading MindSpeed
  installs stand-ins for torch_npu and megatron.training, which must not leak
  into this test session;
* one short suite run with the shipped expectations file, which must be green,
  and the same run against a subclass with an injected fault, which must not be.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conformance.adapters import mindspeed as adapter
from tests.support import ROOT

SPEC = "conformance.adapters.mindspeed:MindSpeedCoC"
EXPECTATIONS = ROOT / "conformance" / "adapters" / "mindspeed.expectations.toml"
PROBE_MODULE = "tests.suite_runs.test_mindspeed_adapter"  # this module, imported by a fresh interpreter
STAND_IN = "stand-in"  # in the __file__ of every module install_cpu_shims creates


def _why_unavailable() -> str | None:
    try:
        adapter.checkout()
    except ImportError as exc:
        return str(exc)
    return None


WHY_UNAVAILABLE = _why_unavailable()
needs_mindspeed = pytest.mark.skipif(WHY_UNAVAILABLE is not None, reason=f"{WHY_UNAVAILABLE}")


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONDONTWRITEBYTECODE": "1"}  # leave no __pycache__ in the MindSpeed checkout
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


# --------------------------------------------------------------------------- without MindSpeed


def test_constructing_without_checkout_says_how_to_point_at_one(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.delenv(adapter.CHECKOUT_ENV, raising=False)
    with pytest.raises(ImportError, match=f"{adapter.CHECKOUT_ENV} is not set.*git clone"):
        adapter.MindSpeedCoC()
    monkeypatch.setenv(adapter.CHECKOUT_ENV, str(tmp_path))
    with pytest.raises(ImportError, match="not a MindSpeed checkout"):
        adapter.MindSpeedCoC()
    assert STAND_IN not in str(getattr(sys.modules.get("torch_npu"), "__file__", "")), "shims installed anyway"


def test_suite_refuses_the_adapter_without_checkout_as_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "conformance.suite.test_config",
         "--coc-impl", SPEC, "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-q"],
        cwd=tmp_path, env=_env(**{adapter.CHECKOUT_ENV: None}), capture_output=True, text=True, timeout=300)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert adapter.CHECKOUT_ENV in result.stderr, result.stderr


# --------------------------------------------------------------------------- unit tests (fresh interpreter)

#: (label, argv, keyword arguments of configure)
CONFIGURE_CASES = [
    ("off", [], {}),
    ("on-4", ["--use-ascend-coc", "--coc-parallel-num", "4"], {}),
    ("mode-1", ["--use-ascend-coc", "--coc-parallel-num", "2", "--coc-mode", "1"], {}),
    ("fused", ["--use-ascend-coc", "--coc-fused-kernel"], {"tp_size": 8}),
    ("unknown-flag", ["--use-ascend-coc", "--coc-parallel-num", "2", "--some-megatron-flag", "7"], {}),
    ("cfgs", ["--use-ascend-coc", "--coc-parallel-num", "2"], {"coc_cfgs": {"recompute_all_gather": False}}),
    ("word", ["--use-ascend-coc", "--coc-parallel-num", "many"], {}),
    ("three", ["--use-ascend-coc", "--coc-parallel-num", "3"], {}),
    ("mc2", ["--use-ascend-coc", "--coc-parallel-num", "2"], {"use_ascend_mc2": True}),
    ("mc2-coc-off", [], {"use_ascend_mc2": True}),
]


def _configured(impl: Any, argv: list[str], kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = {"tp_size": 2, **kwargs}
    try:
        config = impl.configure(argv, {}, **kwargs)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - what MindSpeed raised is the result
        frames = traceback.extract_tb(exc.__traceback__)
        return {"raised": type(exc).__name__, "message": str(exc), "where": frames[-1].filename if frames else ""}
    return {"enabled": config.enabled, "parallel_num": config.parallel_num, "fused_kernel": config.fused_kernel,
            "coc_mode": config.coc_mode, "user_cfgs": config.user_cfgs,
            "extra": getattr(config.args, "some_megatron_flag", None)}


def _shims() -> dict[str, Any]:
    """Which stand-ins are in place (and what they answer)."""
    import torch

    found: dict[str, Any] = {name: STAND_IN in str(getattr(sys.modules.get(name), "__file__", ""))
                             for name in ("torch_npu", "megatron.training", "mindspeed.op_builder")}
    found["torch.npu"] = str(torch.npu.current_device()) if hasattr(torch, "npu") else None
    builder = sys.modules.get("mindspeed.op_builder")
    if found["mindspeed.op_builder"]:
        try:
            builder.LcalOpBuilder().load()  # type: ignore[union-attr]
        except adapter.NativeKernelsUnavailable as exc:
            found["lcal_load"] = str(exc)
    return found


def _patching(impl: Any) -> dict[str, Any]:
    """patch_megatron on a live TP-1 megatron column layer: patched inside, restored after, also on errors."""
    import tempfile

    import torch
    import torch.distributed as dist
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from coc_shared.megatron import build_column, model_parallel

    def current() -> tuple[Any, Any]:
        return ColumnParallelLinear.__dict__["forward"], RowParallelLinear.__dict__["forward"]

    original = current()
    found: dict[str, Any] = {}
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
        with model_parallel(1):
            cuda_device = torch.cuda.current_device  # the harness's CPU redirect, while model_parallel runs
            layer = build_column(16, 8, bias=True)
            x = torch.randn(4, 1, 16, requires_grad=True)
            expected = layer(x)[0].detach()
            on = impl.configure(["--use-ascend-coc", "--coc-parallel-num", "2"], {}, tp_size=1)
            with impl.patch_megatron(on):
                found["patched"] = all(now is not was for now, was in zip(current(), original))
                found["wraps_megatron"] = [getattr(f, "__wrapped__", None) is was
                                           for f, was in zip(current(), original)]
                found["same_output"] = bool(torch.equal(layer(x)[0].detach(), expected))
                # MindSpeed's layer __init__ registered this layer (TP 1: its "original" module type).
                found["mindspeed_registered"] = adapter.load_mindspeed().min_comm.min_comm_config.prefix
            found["restored"] = current() == original
            found["cuda_device_restored"] = torch.cuda.current_device is cuda_device
            try:
                with impl.patch_megatron(on):
                    raise KeyError("boom")
            except KeyError:
                found["restored_after_error"] = current() == original
            with impl.patch_megatron(impl.configure([], {}, tp_size=1)):
                found["off_patches_nothing"] = current() == original
        dist.destroy_process_group()
    return found


def probe() -> None:
    """Run in a fresh interpreter: prints one JSON object of everything the unit tests check."""
    before = _shims()
    real_training = importlib.util.find_spec("megatron.training") is not None  # shipped by megatron-core 0.18+
    impl = adapter.MindSpeedCoC()
    report = {"before": before, "after": _shims(), "root": str(adapter.checkout()), "real_training": real_training,
              "checkout": [adapter.load_mindspeed().checkout.branch, adapter.load_mindspeed().checkout.commit],
              "configure": {label: _configured(impl, argv, kw) for label, argv, kw in CONFIGURE_CASES},
              "patching": _patching(impl)}
    print("PROBE " + json.dumps(report))


@pytest.fixture(scope="module")
def probed() -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-c", f"from {PROBE_MODULE} import probe; probe()"], cwd=ROOT,
                            env=_env(), capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    assert result.returncode == 0 and lines, f"probe failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("PROBE "))


@needs_mindspeed
def test_shims_are_installed_only_when_mindspeed_is_loaded(probed: dict[str, Any]) -> None:
    assert probed["before"] == {"torch_npu": False, "megatron.training": False, "mindspeed.op_builder": False,
                                "torch.npu": None}
    after = probed["after"]
    assert after["torch_npu"] and after["mindspeed.op_builder"]
    assert after["megatron.training"] is not probed["real_training"], "stand-in only where the real one is absent"
    assert after["torch.npu"] == "cpu"
    assert "ATB/LCAL" in after["lcal_load"]


@needs_mindspeed
def test_the_checkout_is_identified(probed: dict[str, Any]) -> None:
    """Branch and commit come from the checkout's git metadata (they pick the expectations and the notes)."""
    git = subprocess.run(["git", "-C", probed["root"], "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = git.stdout.strip()
    assert probed["checkout"][1] == commit


@needs_mindspeed
def test_configure_parses_mindspeed_flags(probed: dict[str, Any]) -> None:
    got = probed["configure"]
    assert got["off"] | {"user_cfgs": None} == {"enabled": False, "parallel_num": 1, "fused_kernel": False,
                                                 "coc_mode": -1, "user_cfgs": None, "extra": None}
    assert (got["on-4"]["enabled"], got["on-4"]["parallel_num"], got["on-4"]["coc_mode"]) == (True, 4, -1)
    assert got["mode-1"]["coc_mode"] == 1
    assert got["fused"]["fused_kernel"] is True
    assert got["unknown-flag"]["extra"] == "7", "unknown flags go through MindSpeed's parser_unknown_args"
    assert got["cfgs"]["user_cfgs"]["recompute_all_gather"] is False
    assert got["cfgs"]["user_cfgs"]["matmul_soc_friendly"] is True  # MindSpeed's default, kept
    assert got["mc2-coc-off"]["enabled"] is False


@needs_mindspeed
def test_configure_refuses_with_mindspeeds_own_errors(probed: dict[str, Any]) -> None:
    """Nothing is wrapped: the exception is MindSpeed's, raised in MindSpeed's code (argparse for a word)."""
    got, root = probed["configure"], probed["root"]
    assert got["word"]["raised"] == "SystemExit"
    assert got["three"]["raised"] == "RuntimeError"
    assert got["three"]["where"].endswith("min_comm_cfg.py") and got["three"]["where"].startswith(root)
    assert got["mc2"]["raised"] == "AssertionError" and "mc2" in got["mc2"]["message"]
    assert got["mc2"]["where"].startswith(os.path.join(root, "mindspeed", "features_manager"))


@needs_mindspeed
def test_patch_megatron_patches_and_restores(probed: dict[str, Any]) -> None:
    got = probed["patching"]
    assert got["patched"] and got["wraps_megatron"] == [True, True]
    assert got["same_output"]
    assert got["mindspeed_registered"] == "module_ORIGINAL_ALL_REDUCE"
    assert got["restored"] and got["cuda_device_restored"] and got["restored_after_error"]
    assert got["off_patches_nothing"]


# --------------------------------------------------------------------------- suite runs


class CorruptsColumnOutput(adapter.MindSpeedCoC):
    """MindSpeed with one injected fault: the patched column layer's output is off by one."""

    name = "mindspeed-fault-column-output"

    @contextmanager
    def patch_megatron(self, config: Any) -> Iterator[None]:
        from megatron.core.tensor_parallel import ColumnParallelLinear

        with super().patch_megatron(config):
            patched = ColumnParallelLinear.forward

            def forward(layer: Any, *args: Any, **kwargs: Any) -> Any:
                output, bias = patched(layer, *args, **kwargs)
                return output + 1.0, bias

            ColumnParallelLinear.forward = forward
            try:
                yield
            finally:
                ColumnParallelLinear.forward = patched


def expectations() -> Path:
    """The shipped expectations written for the checkout's branch and this megatron-core (core_r0.16.0's if none)."""
    from conformance.adapters.mindspeed import provenance
    from conformance.adapters.mindspeed.checkout import identify

    found = identify(adapter.checkout())
    fitting = [f.path for f in provenance.shipped() if f.fits(found.branch, provenance.installed_megatron_core())]
    return fitting[0] if fitting else EXPECTATIONS


def _suite(tmp_path: Path, impl: str, select: str, *args: str, **env: str | None) -> tuple[int, dict[str, Any], str]:
    summary = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "conformance.suite.test_layers",
         "--coc-impl", impl, "--coc-tp", "2", "-k", select, "--coc-expectations", str(expectations()),
         "--coc-summary", str(summary), "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "-q", "-rf",
         *args], cwd=tmp_path, env=_env(**env), capture_output=True, text=True, timeout=600)
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert summary.exists(), output
    return result.returncode, json.loads(summary.read_text()), output


@needs_mindspeed
def test_suite_run_is_green_with_the_shipped_expectations(tmp_path: Path) -> None:
    """Golden layer cases and customized_coc at TP 2: MindSpeed's known failures are known, nothing else fails."""
    code, summary, output = _suite(tmp_path, SPEC, "layer_matches_golden or customized_coc")
    outcomes = summary["outcomes"]
    assert code == 0 and not outcomes.get("failed") and not outcomes.get("error"), output
    assert outcomes.get("passed", 0) >= 70 and outcomes.get("known", 0) >= 1, outcomes


@needs_mindspeed
def test_suite_run_turns_red_on_an_injected_fault(tmp_path: Path) -> None:
    code, summary, output = _suite(tmp_path, "tests.suite_runs.test_mindspeed_adapter:CorruptsColumnOutput",
                                   "layer_matches_golden and column and float32")
    failed = [c for c in summary["cases"] if c["outcome"] == "failed"]
    assert code == pytest.ExitCode.TESTS_FAILED and failed, output
    for case in failed:  # unexpected failures (no expectation covers them), caught by the numerics
        assert "expectation" not in case, case["id"]
        assert any(c["name"] == "numerics" and not c["passed"] for c in case["checks"]), case


@needs_mindspeed
def test_the_scripted_path_runs_on_the_emulated_npu_node(tmp_path: Path) -> None:
    """MindSpeed's scripted CoC on the emulated 8-NPU node (--coc-emulate-npu): its buffers on the rank's NPU, as
    torch_npu's transfer_to_npu gives them (they were put on the CPU, and HCCL took none of them), and its native
    builders stood in where CANN is missing, as on a CPU (an NPU's torch_npu made the adapter import MindSpeed's
    real builders, which need torchair)."""
    code, summary, output = _suite(tmp_path, SPEC, "layer_matches_golden or customized_coc", "--coc-emulate-npu",
                                   "--coc-lease-dir", str(tmp_path / "leases"),
                                   NPU_SIM_NODE_DIR=str(tmp_path / "node"), ASCEND_HOME_PATH=None)
    outcomes = summary["outcomes"]
    assert code == 0 and not outcomes.get("failed") and not outcomes.get("error"), output
    assert outcomes.get("passed", 0) >= 70, outcomes

