"""Configuration conformance (``docs/DESIGN.md#configuration``): precedence, refusals, warnings, every rank.

Effective settings are read through the protocol's ``configure``.

* MUST: the command-line flags set what they say (API over command line);
  invalid or incompatible settings are refused -- any exception -- with a
  message naming the setting, identically on every rank and before any
  collective; nothing is refused while CoC is off.
* SHOULD: the legacy environment variables (and the command line over them),
  one warning per overridden or ineffective setting, the declared error type
  (protocol v2 ``error_types``), one error type per cause, the documented
  ``coc_cfgs`` defaults.

A "warning" is a ``warnings.warn`` of a UserWarning or a log record at WARNING
or above, raised *by configure* (``configure`` is called once unobserved
first, so what its dependencies warn about while being imported does not
count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from conformance.cases.config_cases import configure_on_rank
from conformance.contract.rank_errors import CapturedError
from conformance.harness.captured_calls import call_capturing_errors
from conformance.harness.impl_loader import accepts_keyword
from conformance.harness.rank_warnings import observed_warnings
from conformance.judge import checks
from conformance.judge.config_verdicts import judge_effective, judge_refused
from conformance.protocol import Declarations
from conformance.record.failures import WrongError
from conformance.record.levels import Level
from conformance.record.verdicts import NotJudged, NotOffered

pytestmark = pytest.mark.coc_kind("config")

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
    level: Level = Level.MUST  # of the effective values (legacy environment variables: SHOULD)
    fused: bool = False  # needs fused-kernel layers


PRECEDENCE = [
    Setting("defaults", [], expect={"enabled": False, "fused_kernel": False}),
    Setting("cli-scripted", ON + ["--coc-parallel-num", "4"],
            expect={"enabled": True, "parallel_num": 4, "fused_kernel": False}),
    Setting("cli-auto", ON + ["--coc-parallel-num", "auto"],
            expect={"enabled": True, "parallel_num": "auto"}, level=Level.SHOULD),
    Setting("env-scripted-enables", [], {"COC_PARALLEL_NUM": "2", "USE_COC_FUSED_KERNEL": "0"},
            expect={"enabled": True, "parallel_num": 2, "fused_kernel": False}, level=Level.SHOULD),
    Setting("env-off", [], {"COC_PARALLEL_NUM": "1", "USE_COC_FUSED_KERNEL": "0"},
            expect={"enabled": False, "fused_kernel": False}, level=Level.SHOULD),
    Setting("env-fused", [], {"USE_COC_FUSED_KERNEL": "1"}, tp=8,
            expect={"enabled": True, "fused_kernel": True}, level=Level.SHOULD, fused=True),
    Setting("cli-fused", ON + ["--coc-fused-kernel"], tp=8,
            expect={"enabled": True, "fused_kernel": True}, fused=True),
    Setting("cli-over-env", ON + ["--coc-parallel-num", "4"], {"COC_PARALLEL_NUM": "2"},
            expect={"enabled": True, "parallel_num": 4}, warnings=1,
            warning_names=("COC_PARALLEL_NUM",), level=Level.SHOULD),
    Setting("cli-agrees-env", ON + ["--coc-parallel-num", "4"], {"COC_PARALLEL_NUM": "4"},
            expect={"enabled": True, "parallel_num": 4}, level=Level.SHOULD),
    Setting("fused-over-num-cli", ON + ["--coc-fused-kernel", "--coc-parallel-num", "4"], tp=8,
            expect={"enabled": True, "fused_kernel": True}, warnings=1,
            warning_names=("parallel",), fused=True),
    Setting("fused-over-num-env", [], {"COC_PARALLEL_NUM": "4", "USE_COC_FUSED_KERNEL": "1"}, tp=8,
            expect={"enabled": True, "fused_kernel": True}, warnings=1,
            warning_names=("parallel",), level=Level.SHOULD, fused=True),
    Setting("num-without-enable", ["--coc-parallel-num", "4"],
            expect={"enabled": False}, warnings=1, warning_names=("--use-ascend-coc",)),
]


@dataclass(frozen=True)
class BadSetting:
    """A configuration that must be refused, with a message naming ``names``."""

    id: str
    cause: str  # one error type per cause (SHOULD)
    kind: str  # the protocol's error kind the refusal is declared under
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    names: str = ""  # regex the message must match (the flags involved)
    fused: bool = False  # needs fused-kernel layers
    level: Level = Level.MUST  # of the refusal itself (legacy environment variables: SHOULD)
    #: Accepting it is conforming when the results are right: the MUST is a clear refusal or correct
    #: results (results this suite does not run), the refusal itself a SHOULD.
    or_correct: bool = False


SCRIPTED = ON + ["--coc-parallel-num", "2"]
ERRORS = [
    BadSetting("mc2", "mc2", "incompatible", SCRIPTED, kwargs={"use_ascend_mc2": True},
               names=r"use[-_]ascend[-_]mc2|\bmc2\b"),
    BadSetting("moe", "moe", "incompatible", SCRIPTED, kwargs={"num_experts": 8}, names=r"num[-_]experts|MoE",
               or_correct=True),
    BadSetting("tp-2d", "tp2d", "incompatible", SCRIPTED, kwargs={"tp_2d": True}, names=r"tp[-_]2d|2-?D"),
    BadSetting("transformer-engine", "te", "incompatible", SCRIPTED,
               kwargs={"transformer_impl": "transformer_engine"}, names=r"transformer[-_ ]?(impl|engine)"),
    BadSetting("chunks-cli-3", "chunks", "config", ON + ["--coc-parallel-num", "3"], names=r"coc[-_]parallel[-_]num"),
    BadSetting("chunks-cli-16", "chunks", "config", ON + ["--coc-parallel-num", "16"],
               names=r"coc[-_]parallel[-_]num"),
    BadSetting("chunks-cli-word", "chunks", "config", ON + ["--coc-parallel-num", "many"],
               names=r"coc[-_]parallel[-_]num"),
    BadSetting("chunks-env-6", "chunks", "config", [], {"COC_PARALLEL_NUM": "6"}, names=r"COC_PARALLEL_NUM",
               level=Level.SHOULD),
    BadSetting("fused-env-value", "env-value", "config", [], {"USE_COC_FUSED_KERNEL": "maybe"},
               names=r"USE_COC_FUSED_KERNEL", level=Level.SHOULD),
    BadSetting("tp-size-zero", "tp-size", "config", SCRIPTED, kwargs={"tp_size": 0},
               names=r"tensor[-_ ]model[-_ ]parallel[-_ ]size|tp[-_ ]size"),
    BadSetting("fused-tp4-cli", "fused_tp", "incompatible", ON + ["--coc-fused-kernel"], kwargs={"tp_size": 4},
               names=r"--coc-fused-kernel", fused=True),
    BadSetting("fused-tp2-env", "fused_tp", "incompatible", [], {"USE_COC_FUSED_KERNEL": "1"},
               kwargs={"tp_size": 2}, names=r"USE_COC_FUSED_KERNEL|--coc-fused-kernel", fused=True,
               level=Level.SHOULD),
]
#: The causes that must each have their own error type (SHOULD).
CAUSES = ("mc2", "moe", "tp2d", "te", "chunks", "fused_tp")

USER_CFG_ERRORS = [
    ("unknown-key", {"bogus_key": True}, r"bogus_key"),
    ("bool-as-string", {"recompute_all_gather": "yes"}, r"recompute_all_gather"),
    ("customized-bad-count", {"customized_coc": {"[64, 32, 32]": 3}}, r"customized_coc"),
    ("customized-bad-key", {"customized_coc": {"64x32x32": 2}}, r"customized_coc|64x32x32"),
    ("soc-friendly-int", {"matmul_soc_friendly": 1}, r"matmul_soc_friendly"),
]


def _configure(impl: Any, argv: list[str], env: Mapping[str, str], **kwargs: Any) -> tuple[Any, CapturedError | None]:
    kwargs.setdefault("tp_size", 2)
    call_capturing_errors(impl.configure, [], {}, tp_size=2)  # imports whatever configure imports lazily
    return call_capturing_errors(impl.configure, argv, dict(env), **kwargs)


def _needs_fused(declared: Declarations, fused: bool, impl: Any) -> None:
    if fused and not declared.fused_layers:
        raise NotOffered(f"{impl.name} declares no fused-kernel layers (fused_layers = False)")


@pytest.mark.parametrize("setting", PRECEDENCE, ids=lambda s: s.id)
def test_effective_config_and_warnings(coc_impl: Any, coc_declarations: Declarations, verdicts: Any,
                                       setting: Setting) -> None:
    _needs_fused(coc_declarations, setting.fused, coc_impl)
    with observed_warnings() as seen:
        config, error = _configure(coc_impl, setting.argv, setting.env, tp_size=setting.tp)
    judge_effective(verdicts, config, error, setting.expect, setting.level,
                    what=f"argv={setting.argv} env={setting.env}")
    with verdicts.check("one warning per overridden or ineffective setting", Level.SHOULD):
        assert len(seen) == setting.warnings, f"expected {setting.warnings} warning(s), got {seen}"
        for name in setting.warning_names:
            assert name in seen[0], f"warning does not name {name!r}: {seen[0]!r}"


@pytest.mark.coc_level("SHOULD")
def test_user_cfgs_defaults(coc_impl: Any) -> None:
    config, error = _configure(coc_impl, SCRIPTED, {})
    assert error is None, error.describe() if error else ""
    cfgs = getattr(config, "user_cfgs", None)
    if cfgs is None:
        raise NotOffered(f"{coc_impl.name} reports no user_cfgs")
    get = (lambda k: cfgs[k]) if isinstance(cfgs, Mapping) else (lambda k: getattr(cfgs, k))
    assert get("matmul_soc_friendly") is True
    assert not get("customized_coc")
    assert get("enable_coc_in_column_backward") is False
    assert get("recompute_all_gather") is True


@pytest.mark.parametrize("bad", ERRORS, ids=lambda b: b.id)
def test_refused_naming_the_setting(coc_impl: Any, coc_declarations: Declarations, verdicts: Any,
                                    bad: BadSetting) -> None:
    _needs_fused(coc_declarations, bad.fused, coc_impl)
    _, error = _configure(coc_impl, bad.argv, bad.env, **bad.kwargs)
    judge_refused(verdicts, error, coc_declarations, names=bad.names, kind=bad.kind, level=bad.level,
                  what=f"argv={bad.argv} env={bad.env} {bad.kwargs}", or_correct=bad.or_correct)


@pytest.mark.coc_level("SHOULD")
def test_each_cause_has_its_own_error_type(coc_impl: Any, coc_declarations: Declarations) -> None:
    types: dict[str, set[str]] = {}
    for bad in ERRORS:
        if bad.cause not in CAUSES or (bad.fused and not coc_declarations.fused_layers):
            continue
        _, error = _configure(coc_impl, bad.argv, bad.env, **bad.kwargs)
        if error is not None:
            types.setdefault(bad.cause, set()).add(error.type_name)
    if len(types) < 2:
        raise NotJudged(f"only {sorted(types) or 'no cause'} raised an error: no two causes to tell apart")
    for cause, found in types.items():
        assert len(found) == 1, f"{cause} raised several types: {found}"
    owners: dict[str, list[str]] = {}
    for cause, found in types.items():
        owners.setdefault(next(iter(found)), []).append(cause)
    shared = {t: c for t, c in owners.items() if len(c) > 1}
    assert not shared, f"causes share error types: {shared}"


def test_incompatibilities_only_apply_when_enabled(coc_impl: Any) -> None:
    config, error = _configure(coc_impl, [], {}, use_ascend_mc2=True, num_experts=8, tp_2d=True,
                               transformer_impl="transformer_engine")
    if error is not None:
        raise WrongError(f"configure refused settings although CoC is off (an incompatibility only applies with "
                         f"CoC enabled): {error.describe()}")
    assert config.enabled is False


@pytest.mark.parametrize("case_id, cfgs, names", USER_CFG_ERRORS, ids=[c[0] for c in USER_CFG_ERRORS])
def test_user_cfgs_validated(coc_impl: Any, coc_declarations: Declarations, verdicts: Any, case_id: str,
                             cfgs: dict[str, Any], names: str) -> None:
    if not accepts_keyword(coc_impl.configure, "coc_cfgs"):
        raise NotOffered(f"{coc_impl.name}.configure takes no coc_cfgs (protocol v1)")
    _, error = _configure(coc_impl, SCRIPTED, {}, coc_cfgs=cfgs)
    judge_refused(verdicts, error, coc_declarations, names=names, kind="config", level=Level.MUST,
                  what=f"coc_cfgs={cfgs}")


@pytest.mark.coc_capability("configure")
@pytest.mark.parametrize("world_size", [2, 8])
@pytest.mark.parametrize("bad", [b for b in ERRORS if b.id in ("mc2", "chunks-cli-3", "fused-tp4-cli")],
                         ids=lambda b: b.id)
def test_config_error_on_every_rank_before_any_collective(coc_ranks: Any, coc_impl: Any,
                                                          coc_declarations: Declarations, bad: BadSetting,
                                                          world_size: int) -> None:
    _needs_fused(coc_declarations, bad.fused, coc_impl)
    kwargs = {"tp_size": world_size, **bad.kwargs}
    if bad.cause == "fused_tp":
        kwargs["tp_size"] = 4 if world_size == 8 else world_size
    results = coc_ranks.run(configure_on_rank, world_size, argv=bad.argv, env=bad.env, kwargs=kwargs)
    checks.check_refused_on_every_rank([r.error for r in results], what=f"argv={bad.argv} {bad.kwargs}",
                                       patterns=[bad.names])
    issued = {rank: r.collectives for rank, r in enumerate(results) if r.collectives}
    if issued:
        raise WrongError(f"collectives were issued before the config error (a peer still in one would hang): "
                         f"{issued}")
