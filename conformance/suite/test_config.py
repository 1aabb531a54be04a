"""Configuration conformance (SPEC §2): precedence, warnings, typed errors, every rank.

Effective settings are read through the protocol's ``configure``.  A
"warning" is either a ``warnings.warn`` of a UserWarning or a log record at
WARNING or above: implementations may use either, but must use exactly one
per conflict and none when nothing conflicts.
"""

from __future__ import annotations

import inspect
import logging
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from conformance.cases.config_cases import configure_on_rank

ON = ["--use-ascend-coc"]


@dataclass(frozen=True)
class Setting:
    """One configuration scenario and what a conforming implementation does with it."""

    id: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    tp: int = 2
    expect: dict[str, Any] = field(default_factory=dict)
    warnings: int = 0
    warning_names: tuple[str, ...] = ()  # each must appear in the warning text


PRECEDENCE = [
    Setting("defaults", [], expect={"enabled": False, "fused_kernel": False}),
    Setting("cli-scripted", ON + ["--coc-parallel-num", "4"],
            expect={"enabled": True, "parallel_num": 4, "fused_kernel": False}),
    Setting("cli-auto", ON + ["--coc-parallel-num", "auto"],
            expect={"enabled": True, "parallel_num": "auto"}),
    Setting("env-scripted-enables", [], {"COC_PARALLEL_NUM": "2", "USE_COC_FUSED_KERNEL": "0"},
            expect={"enabled": True, "parallel_num": 2, "fused_kernel": False}),
    Setting("env-off", [], {"COC_PARALLEL_NUM": "1", "USE_COC_FUSED_KERNEL": "0"},
            expect={"enabled": False, "fused_kernel": False}),
    Setting("env-fused", [], {"USE_COC_FUSED_KERNEL": "1"}, tp=8,
            expect={"enabled": True, "fused_kernel": True}),
    Setting("cli-fused", ON + ["--coc-fused-kernel"], tp=8,
            expect={"enabled": True, "fused_kernel": True}),
    Setting("cli-over-env", ON + ["--coc-parallel-num", "4"], {"COC_PARALLEL_NUM": "2"},
            expect={"enabled": True, "parallel_num": 4}, warnings=1,
            warning_names=("COC_PARALLEL_NUM",)),
    Setting("cli-agrees-env", ON + ["--coc-parallel-num", "4"], {"COC_PARALLEL_NUM": "4"},
            expect={"enabled": True, "parallel_num": 4}),
    Setting("fused-over-num-cli", ON + ["--coc-fused-kernel", "--coc-parallel-num", "4"], tp=8,
            expect={"enabled": True, "fused_kernel": True}, warnings=1,
            warning_names=("parallel",)),
    Setting("fused-over-num-env", [], {"COC_PARALLEL_NUM": "4", "USE_COC_FUSED_KERNEL": "1"}, tp=8,
            expect={"enabled": True, "fused_kernel": True}, warnings=1,
            warning_names=("parallel",)),
    Setting("num-without-enable", ["--coc-parallel-num", "4"],
            expect={"enabled": False}, warnings=1, warning_names=("--use-ascend-coc",)),
]


@dataclass(frozen=True)
class BadSetting:
    """A configuration that must be refused with a typed error naming ``names``."""

    id: str
    category: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    names: str = ""  # regex the message must match (the flags involved)


SCRIPTED = ON + ["--coc-parallel-num", "2"]
ERRORS = [
    BadSetting("mc2", "mc2", SCRIPTED, kwargs={"use_ascend_mc2": True}, names=r"--use-ascend-mc2"),
    BadSetting("moe", "moe", SCRIPTED, kwargs={"num_experts": 8}, names=r"num[-_]experts|MoE"),
    BadSetting("tp-2d", "tp2d", SCRIPTED, kwargs={"tp_2d": True}, names=r"tp[-_]2d|2-?D"),
    BadSetting("transformer-engine", "te", SCRIPTED, kwargs={"transformer_impl": "transformer_engine"},
               names=r"transformer[-_ ]?(impl|engine)"),
    BadSetting("chunks-cli-3", "chunks", ON + ["--coc-parallel-num", "3"], names=r"--coc-parallel-num"),
    BadSetting("chunks-cli-16", "chunks", ON + ["--coc-parallel-num", "16"], names=r"--coc-parallel-num"),
    BadSetting("chunks-cli-word", "chunks", ON + ["--coc-parallel-num", "many"], names=r"--coc-parallel-num"),
    BadSetting("chunks-env-6", "chunks", [], {"COC_PARALLEL_NUM": "6"}, names=r"COC_PARALLEL_NUM"),
    BadSetting("fused-tp4-cli", "fused_tp", ON + ["--coc-fused-kernel"], kwargs={"tp_size": 4},
               names=r"--coc-fused-kernel"),
    BadSetting("fused-tp2-env", "fused_tp", [], {"USE_COC_FUSED_KERNEL": "1"}, kwargs={"tp_size": 2},
               names=r"USE_COC_FUSED_KERNEL|--coc-fused-kernel"),
]
#: The six causes SPEC §2 lists; each must have its own error type.
CATEGORIES = ("mc2", "moe", "tp2d", "te", "chunks", "fused_tp")

USER_CFG_ERRORS = [
    ("unknown-key", {"bogus_key": True}, r"bogus_key"),
    ("bool-as-string", {"recompute_all_gather": "yes"}, r"recompute_all_gather"),
    ("customized-bad-count", {"customized_coc": {"[64, 32, 32]": 3}}, r"customized_coc"),
    ("customized-bad-key", {"customized_coc": {"64x32x32": 2}}, r"customized_coc|64x32x32"),
    ("soc-friendly-int", {"matmul_soc_friendly": 1}, r"matmul_soc_friendly"),
]


@contextmanager
def observed_warnings() -> Iterator[list[str]]:
    """Collect UserWarnings and WARNING+ log records raised inside the block."""
    seen: list[str] = []

    class _Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = _Handler(level=logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield seen
    finally:
        root.removeHandler(handler)
        seen.extend(str(w.message) for w in caught if issubclass(w.category, UserWarning))


def _configure(impl: Any, argv: list[str], env: Mapping[str, str], **kwargs: Any) -> Any:
    kwargs.setdefault("tp_size", 2)
    return impl.configure(argv, dict(env), **kwargs)


def _is_config_error(exc: BaseException) -> bool:
    return any(cls.__name__ == "CoCConfigError" for cls in type(exc).__mro__)


@pytest.mark.parametrize("setting", PRECEDENCE, ids=lambda s: s.id)
def test_effective_config_and_warnings(coc_impl: Any, setting: Setting) -> None:
    with observed_warnings() as seen:
        config = _configure(coc_impl, setting.argv, setting.env, tp_size=setting.tp)
    actual = {key: getattr(config, key) for key in setting.expect}
    assert actual == setting.expect, f"argv={setting.argv} env={setting.env}"
    assert len(seen) == setting.warnings, f"expected {setting.warnings} warning(s), got {seen}"
    for name in setting.warning_names:
        assert name in seen[0], f"warning does not name {name!r}: {seen[0]!r}"


def test_user_cfgs_defaults(coc_impl: Any) -> None:
    cfgs = _configure(coc_impl, SCRIPTED, {}).user_cfgs
    get = (lambda k: cfgs[k]) if isinstance(cfgs, Mapping) else (lambda k: getattr(cfgs, k))
    assert get("matmul_soc_friendly") is True
    assert not get("customized_coc")
    assert get("enable_coc_in_column_backward") is False
    assert get("recompute_all_gather") is True


@pytest.mark.parametrize("bad", ERRORS, ids=lambda b: b.id)
def test_typed_error_names_flags(coc_impl: Any, bad: BadSetting) -> None:
    with pytest.raises(Exception) as info:
        _configure(coc_impl, bad.argv, bad.env, **bad.kwargs)
    assert _is_config_error(info.value), f"{type(info.value).__mro__} is not a CoCConfigError"
    assert re.search(bad.names, str(info.value), re.IGNORECASE), (
        f"message does not name the flags ({bad.names}): {info.value}"
    )


def test_each_cause_has_its_own_error_type(coc_impl: Any) -> None:
    types: dict[str, set[type]] = {}
    for bad in ERRORS:
        with pytest.raises(Exception) as info:
            _configure(coc_impl, bad.argv, bad.env, **bad.kwargs)
        types.setdefault(bad.category, set()).add(type(info.value))
    assert set(types) == set(CATEGORIES)
    for category, found in types.items():
        assert len(found) == 1, f"{category} raised several types: {found}"
    distinct = {next(iter(found)) for found in types.values()}
    assert len(distinct) == len(CATEGORIES), f"causes share error types: {types}"


def test_incompatibilities_only_apply_when_enabled(coc_impl: Any) -> None:
    config = _configure(coc_impl, [], {}, use_ascend_mc2=True, num_experts=8, tp_2d=True,
                        transformer_impl="transformer_engine")
    assert config.enabled is False


@pytest.mark.parametrize("case_id, cfgs, names", USER_CFG_ERRORS, ids=[c[0] for c in USER_CFG_ERRORS])
def test_user_cfgs_validated(coc_impl: Any, case_id: str, cfgs: dict[str, Any], names: str) -> None:
    params = inspect.signature(coc_impl.configure).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "coc_cfgs" not in params and not takes_kwargs:
        pytest.skip(f"{coc_impl.name}.configure takes no coc_cfgs")
    with pytest.raises(Exception) as info:
        _configure(coc_impl, SCRIPTED, {}, coc_cfgs=cfgs)
    assert _is_config_error(info.value)
    assert re.search(names, str(info.value)), str(info.value)


@pytest.mark.parametrize("world_size", [2, 8])
@pytest.mark.parametrize("bad", [b for b in ERRORS if b.id in ("mc2", "chunks-env-6", "fused-tp4-cli")],
                         ids=lambda b: b.id)
def test_config_error_on_every_rank_before_any_collective(coc_ranks: Any, bad: BadSetting,
                                                          world_size: int) -> None:
    kwargs = {"tp_size": world_size, **bad.kwargs}
    if bad.category == "fused_tp":
        kwargs["tp_size"] = 4 if world_size == 8 else world_size
    results = coc_ranks.run(configure_on_rank, world_size, argv=bad.argv, env=bad.env, kwargs=kwargs)
    errors = [r["error"] for r in results]
    assert all(e is not None for e in errors), f"rank(s) accepted the config: {errors}"
    assert all("CoCConfigError" in e[2] for e in errors), errors
    assert len({(e[0], e[1]) for e in errors}) == 1, f"ranks disagree: {errors}"
    issued = {rank: r["collectives"] for rank, r in enumerate(results) if r["collectives"]}
    assert not issued, f"collectives issued before the config error: {issued}"
