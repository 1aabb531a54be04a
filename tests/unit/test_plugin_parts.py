"""Implementation loading, collective probes and the plugin's options."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from coc_impl.reference import ReferenceCoC
from conformance.harness.impl_loader import ImplementationLoadError, load_implementation, missing_capability
from conformance.protocol import CoCImplementation
from tests.support import ROOT

INSTANCE = ReferenceCoC()


def make_impl() -> ReferenceCoC:
    return ReferenceCoC()


class ConfigOnly:
    name = "config-only"

    def configure(self, argv, env, **kwargs):
        raise NotImplementedError


def test_impl_spec_forms() -> None:
    assert isinstance(load_implementation("coc_impl.reference:ReferenceCoC"), ReferenceCoC)
    assert load_implementation("tests.unit.test_plugin_parts:INSTANCE") is INSTANCE
    assert isinstance(load_implementation("tests.unit.test_plugin_parts:make_impl"), ReferenceCoC)
    assert isinstance(load_implementation("coc_impl.reference:ReferenceCoC"), CoCImplementation)


@pytest.mark.parametrize("spec, match", [
    ("coc_impl.reference", "expected 'module:attr'"),
    ("no_such_module_xyz:Impl", "no module named 'no_such_module_xyz'"),
    ("coc_impl.reference:Nope", "has no 'Nope'"),
    ("tests.unit.test_plugin_parts:pytest", "lacks 'name' and 'configure'"),
])
def test_bad_impl_specs(spec: str, match: str) -> None:
    with pytest.raises(ImplementationLoadError, match=match):
        load_implementation(spec)


def test_missing_capability_is_named() -> None:
    impl = ConfigOnly()
    assert missing_capability(impl, "matmul_all_reduce") == "config-only does not implement matmul_all_reduce"
    assert missing_capability(INSTANCE, "matmul_all_reduce") is None


def test_coc_tp_option_deselects_other_sizes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sizes="""
        import pytest
        @pytest.mark.parametrize("tp", [2, 4, 8])
        def test_tp(tp):
            pass
        @pytest.mark.parametrize("world_size", [2, 8])
        def test_ws(world_size):
            pass
        def test_plain():
            pass
    """)
    result = pytester.runpytest("-p", "conformance.plugin", "--coc-tp", "2,4", "-q")
    result.assert_outcomes(passed=4, deselected=2)


def test_coc_requires_skips_as_not_offered_with_reason(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A case needing an op the implementation lacks is skipped, its record a check ``not offered`` saying why."""
    pytester.makepyfile(test_req="""
        import pytest
        @pytest.mark.coc_requires("matmul_all_reduce")
        def test_op():
            pass
    """)
    summary = tmp_path / "summary.json"
    result = pytester.runpytest("-p", "conformance.plugin", "--coc-impl",
                                "tests.unit.test_plugin_parts:ConfigOnly", "-q", "--coc-summary", str(summary))
    result.assert_outcomes(skipped=1)
    [case] = json.loads(summary.read_text())["cases"]
    assert case["outcome"] == "skipped" and "config-only does not implement matmul_all_reduce" in case["skip_reason"]
    [check] = case["checks"]
    assert (check["name"], check["level"], check["outcome"]) == ("test_op", "MUST", "not offered"), check
    assert "does not implement matmul_all_reduce" in check["message"]


def test_report_wrappers_run_in_the_stated_order(pytestconfig: pytest.Config) -> None:
    """Each makereport wrapper sees what the ones registered before it decided (conformance.plugin.SUB_PLUGINS)."""
    from conformance.plugin import SUB_PLUGINS

    # pluggy calls the hook implementations from the end of this list to its start; wrappers nest that way.
    called_last_first = [impl.plugin_name for impl in pytestconfig.hook.pytest_runtest_makereport.get_hookimpls()]
    wrappers = [name for name in SUB_PLUGINS if name in called_last_first]
    assert wrappers == ["conformance.plugins.level_gate", "conformance.plugins.known_outcomes",
                        "conformance.plugins.time_breakdown", "conformance.plugins.summary"]
    positions = [called_last_first.index(name) for name in wrappers]
    assert positions == sorted(positions), called_last_first


def test_readme_options_table_lists_every_option() -> None:
    """The options table (docs/options.md, linked from the README) names each option and ini setting the plugin
    registers, and no other."""
    import re

    from conformance import options

    parser = pytest.Parser()
    options.add_options(parser)
    registered = {name for opt in parser.getgroup("coc-conformance").options for name in opt.names()}
    ini = {name for name in parser._inidict if name.startswith("coc_")}
    table = (ROOT / "docs" / "options.md").read_text().split("### Options", 1)[1].split("\n\n", 2)[1]
    assert set(re.findall(r"`(--coc-[a-z-]+)", table)) == registered
    assert set(re.findall(r"ini `(coc_[a-z_]+)`", table)) == ini


@pytest.mark.parametrize("args, named", [
    (["--coc-tp", "abc"], "--coc-tp"), (["--coc-tp", "0"], "--coc-tp"), (["--coc-storm", "-1"], "--coc-storm"),
    (["--coc-case-timeout", "soon"], "--coc-case-timeout"), (["--coc-gate", "must,may"], "--coc-gate"),
])
def test_a_malformed_option_is_a_usage_error_naming_it(pytester: pytest.Pytester, args: list[str],
                                                       named: str) -> None:
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "conformance.plugin", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert named in result.stderr.str()


def test_gate_and_expectations_can_be_pinned_in_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncoc_gate = must\ncoc_expectations = known.toml\n")
    pytester.makefile(".toml", known='[[expect]]\npattern = "test_x.py::test_known"\noutcome = "skip"\n'
                                     'reason = "r"\n')
    pytester.makepyfile(test_x="def test_known():\n    pass\n")
    result = pytester.runpytest("-p", "conformance.plugin", "--coc-summary", str(pytester.path / "s.json"))
    result.assert_outcomes(skipped=1)
    doc = json.loads((pytester.path / "s.json").read_text())
    [case] = doc["cases"]
    assert doc["gate"] == "must" and case["skip_reason"] == "known skip: r", doc


def test_a_case_that_judged_nothing_is_not_judged_in_the_summary_never_passed(pytester: pytest.Pytester,
                                                                              tmp_path: Path) -> None:
    """No invented passed check: a test judging through ``verdicts`` that recorded nothing, or whose body raised
    ``NotJudged``, is a case ``not judged`` with a check not judged; a test judging by its own assertions passes."""
    pytester.makepyfile(test_nothing="""
        import pytest
        from conformance.record.verdicts import NotJudged

        def test_records_nothing(verdicts):
            pass

        def test_swallowed(verdicts):
            raise NotJudged("nothing here to judge")

        @pytest.mark.coc_level("MUST")
        def test_own_assertions():
            assert 1 + 1 == 2
    """)
    summary = tmp_path / "summary.json"
    pytester.runpytest("-p", "conformance.plugin", "--coc-summary", str(summary), "-q")
    doc = json.loads(summary.read_text())
    cases = {c["id"].rsplit("::", 1)[-1]: c for c in doc["cases"]}
    for name in ("test_records_nothing", "test_swallowed"):
        assert cases[name]["outcome"] == "not judged", cases[name]
        assert [c["outcome"] for c in cases[name]["checks"]] == ["not judged"], cases[name]
    assert cases["test_own_assertions"]["outcome"] == "passed"
    assert doc["levels"] == {"MUST:not judged": 2, "MUST:passed": 1}, doc["levels"]


def test_a_skipped_case_does_not_reset_the_storm_count(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Hang, a case that skips (it declares it lacks a mode), hang: two hangs in a row of op:x -- the next case of
    op:x that needs ranks fails unrun (``--coc-storm 2``)."""
    pytester.makepyfile(test_storm="""
        import pytest
        from conformance.harness.case_errors import CaseTimeout

        pytestmark = pytest.mark.coc_capability("op:x")

        def test_1_hangs(coc_ranks):
            raise CaseTimeout("hang 1")

        def test_2_declares_it_lacks_a_mode(coc_ranks):
            pytest.skip("declares no fused-kernel layers")

        def test_3_hangs(coc_ranks):
            raise CaseTimeout("hang 2")

        def test_4_needs_ranks(coc_ranks):
            from tests.support import rank_cases
            coc_ranks.run(rank_cases.whoami, 2)
    """)
    summary = tmp_path / "summary.json"
    pytester.runpytest("-p", "conformance.plugin", "--coc-impl", "coc_impl.reference:ReferenceCoC",
                       "--coc-storm", "2", "--coc-summary", str(summary), "-q")
    cases = {c["id"].rsplit("::", 1)[-1]: c for c in json.loads(summary.read_text())["cases"]}
    assert cases["test_2_declares_it_lacks_a_mode"]["outcome"] == "skipped"
    assert cases["test_4_needs_ranks"]["outcome"] == "failed", cases["test_4_needs_ranks"]
    assert cases["test_4_needs_ranks"]["failure"]["type"] == "StormBroken", cases["test_4_needs_ranks"]


def test_auto_workers_fit_the_node() -> None:
    """``-n auto`` on the suite: in one process below 8 cores, one worker per four cores, one per accelerator."""
    from conformance.plugins.scheduling import auto_workers

    assert [auto_workers(0, cores) for cores in (1, 2, 4, 7, 8, 16, 64)] == [0, 0, 0, 0, 2, 4, 16]
    assert auto_workers(8, 192) == 8


@pytest.mark.parametrize(("args", "pyargs", "expected"), [
    (["conformance.suite"], True, True),
    (["conformance.suite.test_ops::test_corner_tp1"], True, True),
    (["conformance/suite"], False, True),
    (["conformance/suite/test_ops.py::test_corner_tp1"], False, True),
    (["tests/unit"], False, False),
    ([], False, False),
    (["conformance.suite"], False, False),  # a path that does not exist, without --pyargs
])
def test_the_suite_is_recognised_on_the_command_line(args: list[str], pyargs: bool, expected: bool) -> None:
    from types import SimpleNamespace

    from conformance.plugins.scheduling import runs_the_suite

    config = SimpleNamespace(args=args, invocation_params=SimpleNamespace(dir=ROOT),
                             getoption=lambda name, default=None: pyargs if name == "pyargs" else default)
    assert runs_the_suite(config) is expected  # type: ignore[arg-type]


def test_auto_workers_leave_other_test_suites_to_xdist(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin is loaded in every session of an environment that has it: ``-n auto`` elsewhere is xdist's."""
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    pytester.makepyfile(test_other="def test_one():\n    pass\n")
    # In a subprocess (xdist's workers in this one would outlive pytester's module snapshot); on a machine
    # of fewer than 8 cores the suite's rule would start none.
    result = pytester.runpytest_subprocess("-p", "conformance.plugin", "-n", "auto")
    result.assert_outcomes(passed=1)
    assert "created:" in result.stdout.str() or "bringing up nodes" in result.stdout.str()


@pytest.mark.parametrize(("node", "cores", "workers"), [("cpu", 2, 0), ("cpu", 16, 4), ("npu-sim", 2, 0),
                                                         ("npu-sim", 16, 4), ("npu", 2, 8)])
def test_auto_workers_on_the_suite_are_the_suites(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch,
                                                  node: str, cores: int, workers: int) -> None:
    """The answer xdist gets: on 2 cores no workers, on 16 cores four, where the devices compute on the host (a
    CPU, the emulated NPU node's eight cards); one per card on an NPU node; asked before xdist's own (which always
    answers, and the first answer wins)."""
    from types import SimpleNamespace

    from conformance import options
    from conformance.harness.launchers.devices import DeviceKind, cpu
    from conformance.plugin import pytest_xdist_auto_num_workers

    impls = pytestconfig.pluginmanager.hook.pytest_xdist_auto_num_workers.get_hookimpls()
    assert impls[-1].plugin_name == "conformance.plugin"  # pluggy calls the last one first
    given = {options.LAUNCHER: "process", options.CPU_SLOTS: 8, options.BACKEND: None,
             options.RANKS_PER_DEVICE: 1, "pyargs": True}
    config = SimpleNamespace(args=["conformance.suite"], invocation_params=SimpleNamespace(dir=ROOT),
                             getoption=lambda name, default=None: given.get(name, default))
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr("conformance.options.available_cores", lambda: cores)
    # The node, said without asking torch (pytester's runs in this process unload what they imported).
    kind = cpu(8) if node == "cpu" else DeviceKind("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", 8,
                                                   emulated=node == "npu-sim")
    monkeypatch.setattr("conformance.harness.launchers.devices.detect_device_kind", lambda *_, **__: kind)
    assert pytest_xdist_auto_num_workers(config) == workers  # type: ignore[arg-type]
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")  # the user's say stays xdist's
    assert pytest_xdist_auto_num_workers(config) is None  # type: ignore[arg-type]


def test_megatron_is_preloaded_only_when_a_case_left_to_run_builds_its_state(pytester: pytest.Pytester) -> None:
    from conformance.plugins.scheduling import needs_megatron_key

    pytester.makepyfile(test_cases="""
        import pytest
        @pytest.mark.coc_requires("patch_megatron")
        def test_layer(coc_ranks):
            pass
        def test_op(coc_ranks):
            pass
    """)
    for args, expected in ((["-k", "op"], False), ([], True)):
        run = pytester.inline_run("-p", "conformance.plugin", "--collect-only", *args)
        session = run.getcall("pytest_collection_finish").session
        assert session.config.stash[needs_megatron_key] is expected


COLLECT_AND_SAY = """
import sys, pytest

class Say:
    def pytest_collection_finish(self, session):
        print("collected", len(session.items), "imported", sorted(m for m in ("torch", "numpy") if m in sys.modules))

pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--pyargs", "conformance.suite",
             "--rootdir", sys.argv[1], "-c", sys.argv[1] + "/pyproject.toml"], plugins=[Say()])
"""


def test_collecting_the_suite_imports_no_torch(tmp_path: Path) -> None:
    """Every ``-k`` selection pays collection: what only running a case needs (torch: over a second of imports) is
    imported when a case runs."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", COLLECT_AND_SAY, str(ROOT)], cwd=tmp_path, capture_output=True,
                          text=True)
    said = [line for line in done.stdout.splitlines() if line.startswith("collected")]
    assert said and int(said[0].split()[1]) > 100, done.stdout[-2000:] + done.stderr[-2000:]
    assert "'torch'" not in said[0], said[0]


def test_a_test_that_is_no_conformance_check_keeps_its_own_exceptions(pytester: pytest.Pytester) -> None:
    """``NotJudged`` or ``NotOffered`` raised by a test of the session that judges no implementation (the project's
    own tests) fails it: the plugin records them only for conformance checks, and never turns them into a pass."""
    pytester.makepyfile(test_own="""
        from conformance.record.verdicts import NotJudged, NotOffered

        def test_not_judged():
            raise NotJudged("a rule under test raised where it should not")

        def test_not_offered():
            raise NotOffered("the same")
    """)
    result = pytester.runpytest("-p", "conformance.plugin", "-q")
    result.assert_outcomes(failed=2)


def test_a_suite_error_keeps_the_checks_before_it_and_the_case_is_the_worse_verdict(pytester: pytest.Pytester,
                                                                                    tmp_path: Path) -> None:
    """A bug of the suite after a failed MUST check: the case failed (the worse verdict), its checks kept, the
    suite's error beside them; after a passed check only: an error of the run, the check kept (issue 50: the
    failure recorded before it was dropped, and the headline blamed the suite)."""
    pytester.makepyfile(test_bug="""
        from conformance.record.failures import ContractViolation
        from conformance.record.levels import Level

        def test_failed_then_bug(verdicts):
            with verdicts.check("results are values", Level.MUST):
                raise ContractViolation("rank 1: expected a tensor [64, 48], got [64, 47]")
            raise RuntimeError("a judge's own bug")

        def test_passed_then_bug(verdicts):
            with verdicts.check("results are values", Level.MUST):
                pass
            raise RuntimeError("a judge's own bug")
    """)
    summary = tmp_path / "summary.json"
    result = pytester.runpytest("-p", "conformance.plugin", "--coc-summary", str(summary), "-q")
    result.assert_outcomes(failed=1, errors=1)
    cases = {c["id"].rsplit("::", 1)[-1]: c for c in json.loads(summary.read_text())["cases"]}
    failed, error = cases["test_failed_then_bug"], cases["test_passed_then_bug"]
    assert failed["outcome"] == "failed" and "a judge's own bug" in failed["suite_error"], failed
    assert [(c["name"], c["outcome"]) for c in failed["checks"]] == [("results are values", "failed")]
    assert failed["failure"]["category"] == "result contract", failed
    assert error["outcome"] == "error" and error["failure"]["category"] == "suite error", error
    assert [(c["name"], c["outcome"]) for c in error["checks"]] == [("results are values", "passed")]


def test_stale_expectations_warn_in_a_partial_run_and_fail_a_whole_one(pytester: pytest.Pytester, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry matching no case, or naming a check none of its cases recorded, is reported at the end of the run
    and in the summary; it fails only a run of the whole suite (where it can only be stale)."""
    from conformance.plugins import known_outcomes

    pytester.makefile(".toml", known='[[expect]]\npattern = "test_x.py::test_known"\noutcome = "fail"\n'
                                     'reason = "r"\ncheck = "numerix"\n\n[[expect]]\npattern = "test_gone.py::*"\n'
                                     'outcome = "skip"\nreason = "r"\n')
    pytester.makepyfile(test_x="""
        from conformance.record.levels import Level

        def test_known(verdicts):
            with verdicts.check("numerics", Level.MUST):
                pass
    """)
    summary = tmp_path / "s.json"
    args = ("-p", "conformance.plugin", "--coc-expectations", "known.toml", "--coc-summary", str(summary))
    partial = pytester.runpytest(*args)
    assert partial.ret == 0 and "coc-conformance: stale expectations" in partial.stdout.str()
    doc = json.loads(summary.read_text())
    assert doc["full_run"] is False and [entry.split(": ", 1)[1] for entry in doc["stale_expectations"]] == [
        "check 'numerix' names no check its 1 case(s) recorded", "pattern 'test_gone.py::*' matches no case of the run"]
    monkeypatch.setattr(known_outcomes.StaleEntries, "full_run", lambda self: True)
    whole = pytester.runpytest(*args)
    assert whole.ret == 1 and json.loads(summary.read_text())["full_run"] is True


@pytest.mark.parametrize(("cores", "workers", "threads"), [(2, 2, 1), (16, 8, 2), (16, 3, 5), (2, 8, 1), (8, 0, 8)])
def test_a_worker_takes_its_share_of_the_cores(cores: int, workers: int, threads: int) -> None:
    from conformance.plugins.worker_threads import worker_threads

    assert worker_threads(cores, workers) == threads


def test_worker_threads_are_set_on_xdist_workers_only_and_never_over_the_users(monkeypatch) -> None:
    from types import SimpleNamespace

    from conformance.plugins import worker_threads as plugin

    monkeypatch.setattr(plugin.options, "available_cores", lambda: 16)
    monkeypatch.setenv(plugin.THREADS_VARIABLE, "")  # recorded, so that what the hook sets is undone after
    monkeypatch.delenv(plugin.THREADS_VARIABLE)
    plugin.pytest_configure(SimpleNamespace())  # the controller, or a run without xdist: its threads are its own
    assert plugin.THREADS_VARIABLE not in os.environ
    worker = SimpleNamespace(workerinput={"workercount": 4})
    plugin.pytest_configure(worker)
    assert os.environ[plugin.THREADS_VARIABLE] == "4"
    monkeypatch.setenv(plugin.THREADS_VARIABLE, "3")  # the user's
    plugin.pytest_configure(worker)
    assert os.environ[plugin.THREADS_VARIABLE] == "3"
