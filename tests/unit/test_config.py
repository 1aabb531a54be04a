"""coc_impl.config: flags, environment, user cfgs, precedence, typed errors."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import pytest

from coc_impl import errors
from coc_impl.config import CoCConfigWarning, resolve_config
from coc_impl.config_sources import add_coc_args
from coc_impl.user_cfgs import UserCfgs

ON = ["--use-ascend-coc"]


def resolve(*args, **kwargs):
    kwargs.setdefault("tp_size", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = resolve_config(*args, **kwargs)
    return config, [w for w in caught if issubclass(w.category, CoCConfigWarning)]


def test_defaults_are_off() -> None:
    config, warned = resolve([], {})
    assert (config.enabled, config.parallel_num, config.fused_kernel) == (False, 1, False)
    assert config.user_cfgs == UserCfgs() and not warned
    assert config.chunks_for(64, 8, 8) == 1


def test_add_coc_args_on_a_megatron_style_parser() -> None:
    parser = add_coc_args(argparse.ArgumentParser())
    ns = parser.parse_args(ON + ["--coc-parallel-num", "8", "--coc-fused-kernel"])
    assert (ns.use_ascend_coc, ns.coc_parallel_num, ns.coc_fused_kernel) == (True, "8", True)
    config, warned = resolve(ns, {}, tp_size=8)
    assert config.fused_kernel and len(warned) == 1 and "--coc-parallel-num 8" in str(warned[0].message)


def test_api_beats_cli_beats_env_with_one_warning() -> None:
    config, warned = resolve(ON + ["--coc-parallel-num", "4"], {"COC_PARALLEL_NUM": "2"}, parallel_num=8)
    assert config.parallel_num == 8
    assert len(warned) == 1
    text = str(warned[0].message)
    assert "--coc-parallel-num=4" in text and "COC_PARALLEL_NUM=2" in text


def test_env_alone_enables_and_disables() -> None:
    assert resolve([], {"COC_PARALLEL_NUM": "4"})[0].enabled
    assert resolve([], {"USE_COC_FUSED_KERNEL": "1"}, tp_size=8)[0].fused_kernel
    assert not resolve([], {"COC_PARALLEL_NUM": "1", "USE_COC_FUSED_KERNEL": "0"})[0].enabled


def test_settings_without_effect_are_reported() -> None:
    assert len(resolve(["--coc-parallel-num", "4"], {})[1]) == 1
    _, warned = resolve([], {}, enabled=True, fused_kernel=True, parallel_num=2, tp_size=8)
    assert "no effect" in str(warned[0].message)
    _, warned = resolve(ON + ["--coc-parallel-num", "2"], {},
                        coc_cfgs={"enable_coc_in_column_backward": True})
    assert "fused kernel only" in str(warned[0].message)


def test_ineffective_settings_warn_for_a_coc_cfgs_file_too(tmp_path: Path) -> None:
    """A ``coc_cfgs`` JSON path gets the same warnings as the dict it holds (nothing ignored silently)."""
    path = tmp_path / "coc_cfgs.json"
    path.write_text(json.dumps({"enable_coc_in_column_backward": True}))
    _, from_dict = resolve(ON + ["--coc-parallel-num", "2"], {}, coc_cfgs={"enable_coc_in_column_backward": True})
    _, from_file = resolve(ON + ["--coc-parallel-num", "2"], {}, coc_cfgs=str(path))
    assert [str(w.message) for w in from_file] == [str(w.message) for w in from_dict]
    assert len(from_file) == 1 and "fused kernel only" in str(from_file[0].message)


@pytest.mark.parametrize("env, tp_size", [({"USE_COC_FUSED_KERNEL": "maybe"}, 8), ({}, 0), ({}, True), ({}, "2")])
def test_malformed_values_are_value_errors_not_user_cfg_errors(env: dict[str, str], tp_size: object) -> None:
    """A bad flag / variable value or size has its own type, not the one documented for coc_cfgs."""
    with pytest.raises(errors.CoCSettingValueError) as info:
        resolve(ON, env, tp_size=tp_size)
    assert not isinstance(info.value, errors.CoCUserCfgError)
    assert "USE_COC_FUSED_KERNEL" in str(info.value) or "tensor-model-parallel-size" in str(info.value)


@pytest.mark.parametrize("kwargs, error", [
    ({"use_ascend_mc2": True}, errors.CoCWithMC2Error),
    ({"num_experts": 4}, errors.CoCMoEError),
    ({"tp_2d": True}, errors.CoCTP2DError),
    ({"transformer_impl": "transformer_engine"}, errors.CoCTransformerEngineError),
    ({"fused_kernel": True, "tp_size": 4}, errors.CoCFusedTPError),
    ({"parallel_num": 3}, errors.CoCChunkCountError),
    ({"tp_size": 0}, errors.CoCSettingValueError),
])
def test_incompatibilities_are_typed(kwargs, error) -> None:
    with pytest.raises(error) as info:
        resolve(ON + ["--coc-parallel-num", "2"], {}, **kwargs)
    assert isinstance(info.value, errors.CoCConfigError)


@pytest.mark.parametrize("raw", ["0", "3", "16", "-2", "two", "2.0"])
def test_bad_chunk_counts(raw: str) -> None:
    with pytest.raises(errors.CoCChunkCountError, match="--coc-parallel-num"):
        resolve(ON + ["--coc-parallel-num", raw], {})
    with pytest.raises(errors.CoCChunkCountError, match="COC_PARALLEL_NUM"):
        resolve([], {"COC_PARALLEL_NUM": raw})


def test_bad_fused_env_value() -> None:
    with pytest.raises(errors.CoCConfigError, match="USE_COC_FUSED_KERNEL"):
        resolve([], {"USE_COC_FUSED_KERNEL": "maybe"})


def test_customized_coc_overrides_parallel_num_per_shape() -> None:
    config, _ = resolve(ON + ["--coc-parallel-num", "2"], {},
                        coc_cfgs={"customized_coc": {"[16384, 5120, 1920]": 8, "[64,32,32]": 1}})
    assert config.chunks_for(16384, 5120, 1920) == 8
    assert config.chunks_for(64, 32, 32) == 1
    assert config.chunks_for(64, 32, 16) == 2


@pytest.mark.parametrize("cfgs, match", [
    ({"nope": 1}, "unknown key"),
    ({"recompute_all_gather": 1}, "recompute_all_gather"),
    ({"customized_coc": {"[1, 2]": 2}}, "customized_coc"),
    ({"customized_coc": {"[1, 2, 3]": 5}}, "customized_coc"),
    ({"customized_coc": [1, 2]}, "customized_coc"),
    ("not-a-file.json", "cannot be read"),
])
def test_user_cfgs_validation(cfgs, match: str) -> None:
    with pytest.raises(errors.CoCConfigError, match=match):
        UserCfgs.from_mapping(cfgs)


def test_user_cfgs_from_json_file(tmp_path: Path) -> None:
    path = tmp_path / "coc_cfgs.json"
    path.write_text(json.dumps({"recompute_all_gather": False, "customized_coc": {"[8, 4, 4]": 4}}))
    cfgs = UserCfgs.from_mapping(path)
    assert cfgs.recompute_all_gather is False and cfgs.chunks_for(8, 4, 4) == 4
