"""The MindSpeed adapter's discovery and signature logic, on small fakes (no MindSpeed checkout needed)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conformance.adapters.mindspeed import compat, configuration, layer_patch, loading, provenance, shims
from conformance.adapters.mindspeed.checkout import Checkout, identify


class Feature:
    """A MindSpeed feature as the feature manager holds it."""

    def __init__(self, name: str) -> None:
        self.feature_name = name

    def register_args(self, parser: argparse.ArgumentParser) -> None:
        if self.feature_name == "use-ascend-coc":
            parser.add_argument("--use-ascend-coc", action="store_true")

    def validate_args(self, args: argparse.Namespace) -> None:
        """Validates nothing."""


class PolicesCoC(Feature):
    def validate_args(self, args: argparse.Namespace) -> None:
        if args.use_ascend_coc and args.transformer_impl == "transformer_engine":
            raise AssertionError("transformer engine does not support ascend coc")


class Unrelated(Feature):
    def validate_args(self, args: argparse.Namespace) -> None:
        if args.fp8 and args.transformer_impl == "local":
            raise AssertionError("FP8 just support TE implement.")


FEATURES = [Unrelated("fp8"), Feature("use-ascend-coc"), PolicesCoC("npu_enhancement")]


def test_validators_are_discovered_by_what_they_read() -> None:
    policing = [f.feature_name for f in FEATURES if configuration.polices_coc(f)]
    assert policing == ["use-ascend-coc", "npu_enhancement"]
    args = argparse.Namespace(use_ascend_coc=True, transformer_impl="transformer_engine", fp8=True)
    with pytest.raises(AssertionError, match="transformer engine"):
        configuration.validate(FEATURES, args)  # the unrelated FP8 rule (which would refuse too) is not run
    assert configuration.coc_feature(FEATURES).feature_name == "use-ascend-coc"
    with pytest.raises(ImportError, match="no use_ascend_coc feature.*fp8"):
        configuration.coc_feature(FEATURES[:1])


def test_unknown_flags_go_through_mindspeed_or_are_dropped() -> None:
    def unknown_args(known: dict[str, Any], unknown: list[str]) -> dict[str, Any]:
        return {**known, "unknown": unknown}

    argv = ["--use-ascend-coc", "--seq-len", "7"]
    assert configuration.parse_mindspeed_args(FEATURES, unknown_args, argv).unknown == ["--seq-len", "7"]
    dropped = configuration.parse_mindspeed_args(FEATURES, None, argv)
    assert vars(dropped) == {"use_ascend_coc": True}


def test_mc2_is_configured_with_sequence_parallelism() -> None:
    args = argparse.Namespace()
    configuration.add_megatron_args(args, tp_size=2, num_experts=None, use_ascend_mc2=True, tp_2d=False,
                                    transformer_impl="local")
    assert (args.use_ascend_mc2, args.sequence_parallel) == (True, True)
    plain = argparse.Namespace()
    configuration.add_megatron_args(plain, tp_size=2, num_experts=None, use_ascend_mc2=False, tp_2d=False,
                                    transformer_impl="local")
    assert plain.sequence_parallel is False
    with_2d = argparse.Namespace(tp_x=2, tp_y=1)
    configuration.add_megatron_args(with_2d, tp_size=2, num_experts=None, use_ascend_mc2=True, tp_2d=True,
                                    transformer_impl="local")
    assert with_2d.sequence_parallel is False  # TP-2D refuses SP on every branch


class Layer:
    """What group_arguments reads of a megatron layer."""

    tp_group = "the-tp-group"
    is_expert = False


def takes_tp_group(self: Any, input_size: int, *, tp_group: Any = None, use_coc: Any = None, divide: Any = None,
                   **kwargs: Any) -> None:
    """core_r0.18.0's layer __init__: tp_group, and **kwargs that refuse parallel_group."""


def takes_parallel_group(self: Any, input_size: int, *, parallel_group: Any = None, divide: Any = None) -> None:
    """The layer __init__ of the branches before core_r0.18.0."""


def test_layer_arguments_follow_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import parallel_state

    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_group", lambda *a, **k: "the-default-group")
    monkeypatch.setattr(layer_patch, "tp_group_resolver", lambda: None)
    offered = {"divide": "divide", "_reduce": "reduce"}
    assert layer_patch.layer_arguments(takes_tp_group, Layer(), offered) == {"tp_group": "the-tp-group",
                                                                        "divide": "divide"}
    assert layer_patch.layer_arguments(takes_parallel_group, Layer(), offered) == {
        "parallel_group": "the-default-group", "divide": "divide"}

    def resolve(kwargs: dict[str, Any]) -> tuple[Any, ...]:
        assert kwargs == {"tp_group": "the-tp-group", "is_expert": False}
        return "resolved", True, "get-group", "get-world-size", "get-rank"

    monkeypatch.setattr(layer_patch, "tp_group_resolver", lambda: resolve)
    assert layer_patch.layer_arguments(takes_tp_group, Layer(), offered) == {"tp_group": "resolved", "use_coc": True,
                                                                        "divide": "divide"}


def test_hands_back_where_the_branch_forward_would() -> None:
    config = argparse.Namespace(coc_mode=-1, coc_fused_kernel=False)
    layer = argparse.Namespace(config=argparse.Namespace())
    assert not layer_patch.hands_back_to_megatron(config, layer, row=False)
    assert layer_patch.hands_back_to_megatron(argparse.Namespace(coc_mode=0, coc_fused_kernel=False), layer, row=False)
    assert layer_patch.hands_back_to_megatron(config, argparse.Namespace(config=layer.config, use_coc=False), row=False)
    nocomm = argparse.Namespace(config=argparse.Namespace(coc_row_nocomm=True))
    assert layer_patch.hands_back_to_megatron(config, nocomm, row=True)


def test_compat_adds_group_only_where_it_is_required() -> None:
    def no_group(input_: Any) -> Any: ...

    def required(input_: Any, group: Any) -> Any: ...

    def optional(input_: Any, group: Any = None) -> Any: ...

    assert [compat.requires_group(f) for f in (no_group, required, optional)] == [False, True, False]


def test_missing_dependency_is_named_as_such(tmp_path: Path) -> None:
    found = Checkout(tmp_path, "core_r0.17.0", "1f5feb86" * 5)
    dependency = loading.missing_module_error(found, ModuleNotFoundError("no", name="megatron_adaptor"))
    assert "'megatron_adaptor'" in str(dependency) and "missing dependency" in str(dependency)
    assert f"{loading.STAND_IN_ENV}=megatron_adaptor" in str(dependency)
    assert "core_r0.17.0 @ 1f5feb86" in str(dependency)
    own = loading.missing_module_error(found, ModuleNotFoundError("no", name="mindspeed.args_utils"))
    assert "not a branch" in str(own) and "missing dependency" not in str(own)


def test_stand_ins_are_the_users_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loading.STAND_IN_ENV, " megatron_adaptor, other ,")
    assert loading.stand_ins() == ("megatron_adaptor", "other")
    monkeypatch.delenv(loading.STAND_IN_ENV)
    assert loading.stand_ins() == ()


def test_the_stand_in_device_is_neutral() -> None:
    npu = shims.npu_namespace()
    with pytest.raises(NotImplementedError, match="no NPU"):
        npu.get_device_name()
    with pytest.raises(shims.NativeKernelsUnavailable, match="ATB/LCAL"):
        shims.unavailable_builder("LcalOpBuilder")().load()
    assert issubclass(shims.NativeKernelsUnavailable, NotImplementedError)  # a missing capability: cases skip


def _written(tmp_path: Path, name: str, branch: str, commit: str, release: str) -> None:
    (tmp_path / name).write_text(f'[meta]\nbranch = "{branch}"\ncommit = "{commit}"\nmegatron_core = "{release}"\n')


def test_expectations_are_matched_by_branch_release_and_commit(tmp_path: Path) -> None:
    _written(tmp_path, "mindspeed.expectations.toml", "core_r0.16.0", "e4772499" * 5, "0.16")
    _written(tmp_path, "mindspeed.core_r0.18.0.expectations.toml", "core_r0.18.0", "4213c913" * 5, "0.18")
    (tmp_path / "mindspeed.broken.expectations.toml").write_text("[meta\n")
    files = provenance.shipped(tmp_path)
    assert [f.branch for f in files] == ["core_r0.18.0", "core_r0.16.0"]
    assert provenance.notes(Checkout(tmp_path, "core_r0.16.0", "e4772499" * 5), "0.16.1", files) == []
    moved = provenance.notes(Checkout(tmp_path, "core_r0.16.0", "0badc0de" * 5), "0.16.1", files)
    assert len(moved) == 1 and "written for commit e4772499, not this one" in moved[0]
    other_release = provenance.notes(Checkout(tmp_path, "core_r0.16.0", "e4772499" * 5), "0.17.0", files)
    assert "no shipped expectations" in other_release[0] and "core_r0.18.0 on megatron-core 0.18" in other_release[0]
    assert not provenance.release_matches("0.160.1", "0.16")


def test_checkout_branch_and_commit_come_from_git(tmp_path: Path) -> None:
    assert identify(tmp_path) == Checkout(tmp_path)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q", "-b", "core_r0.18.0")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    commit = git("rev-parse", "HEAD")
    assert identify(tmp_path) == Checkout(tmp_path, "core_r0.18.0", commit)
    git("checkout", "-q", "--detach")
    assert identify(tmp_path).branch == "core_r0.18.0"  # detached: named by the branch that holds the commit
