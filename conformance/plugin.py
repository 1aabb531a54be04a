"""pytest plugin (entry point ``pytest11``): the suite's options, fixtures and markers.

Loaded into every pytest run of an environment where the package is installed,
so it imports nothing heavy at load time: torch, launchers and the
implementation are imported when a fixture first needs them.  Each feature is
a small plugin module registered here (``conformance.plugins.*`` and, with
``--alluredir``, ``conformance.reporting.hooks``); how the ranks are launched is
:mod:`conformance.launching`.
"""

from __future__ import annotations

__all__ = ["SUB_PLUGINS", "coc_declarations", "coc_impl", "coc_impl_spec", "coc_ranks"]

import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

from conformance import launching, options
from conformance.case_kinds import KIND_MARKER
from conformance.options import impl_spec
from conformance.roster import is_xdist_worker

if TYPE_CHECKING:
    from conformance.harness.runner import CaseRanks
    from conformance.protocol import Declarations

#: Sub-plugins, in registration order (each is a module of hook implementations).
#:
#: The order matters where several wrap ``pytest_runtest_makereport``: pluggy
#: runs the wrapper registered later *around* the ones before it, so each sees
#: the report as the earlier ones left it.  ``level_gate`` turns a failure of a
#: level that does not gate into an expected failure; ``known_outcomes`` then
#: applies the expectations file (and leaves those alone); ``time_breakdown``
#: adds the timings; ``summary`` records the final outcome last.
#: ``tests/unit/test_plugin_parts.py`` holds the plugins to this order.
SUB_PLUGINS = (
    "conformance.roster",
    "conformance.plugins.worker_threads",
    "conformance.plugins.level_gate",
    "conformance.plugins.scheduling",
    "conformance.plugins.known_outcomes",
    "conformance.plugins.breaker",
    "conformance.plugins.exploring",
    "conformance.plugins.corpus_replay",
    "conformance.plugins.time_breakdown",
    "conformance.plugins.summary",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)  # before anything starts a process or imports torch (the suite's fork server)
def pytest_configure(config: pytest.Config) -> None:
    if config.getoption(options.EMULATE_NPU):
        _emulate_npu()
    config.addinivalue_line("markers", "coc_requires(*capabilities): skip unless the "
                            "implementation under test provides these ops")
    config.addinivalue_line("markers", "coc_level(level): the requirement level (MUST, SHOULD, "
                            "STRUCTURE) of a test's checks that do not name one")
    config.addinivalue_line("markers", "coc_capability(name): the op or layer kind a case exercises "
                            "(hang storms are counted per capability)")
    config.addinivalue_line("markers", "coc_builds_megatron: the case may build Megatron layers on its ranks "
                            "(the rank processes preload megatron-core), as the explorer does")
    config.addinivalue_line("markers", f"{KIND_MARKER}(kind): the kind of case a suite module holds (op, layer, "
                            "training, config, perf, explore, corpus): the report's feature, the explorer's cases")
    config.addinivalue_line("markers", "perf: performance gate (exclusive device lease)")
    config.addinivalue_line("markers", "large: large shapes, not in the default CPU run")
    config.addinivalue_line("markers", "smoke: the per-change tier (conformance/smoke_tier.json: cases that catch "
                            "every fault of the proof table and hold every check, op and layer kind, and the corpus)")
    import importlib

    from conformance.harness.captured_calls import guard_exits

    guard_exits()  # the implementation's code run in this process (configure, thread ranks) cannot end the run
    if not is_xdist_worker(config) and config.getoption(options.LAUNCHER) == "process":
        config.pluginmanager.register(launching.RankServerHooks(), "coc-rank-server")
    for name in SUB_PLUGINS:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.register(importlib.import_module(name), name)
    if config.getoption("allure_report_dir", None):  # allure-pytest writes results: describe the cases
        from conformance.reporting.hooks import AllureHooks

        config.pluginmanager.register(AllureHooks(config), "coc-allure-hooks")


def _emulate_npu() -> None:
    """``--coc-emulate-npu``: the emulated NPU node in this process and every one it starts, or a usage error."""
    from conformance.harness.launchers.npu_emulation import EmulatedNpuError, emulate_npu

    try:
        emulate_npu()
    except EmulatedNpuError as exc:
        raise pytest.UsageError(f"{options.EMULATE_NPU}: {exc}") from None


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own, which always answers
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on the suite: workers that fit the node (``scheduling.auto_workers``: by its accelerators, by its
    cores where the devices compute on the host); elsewhere, or with ``PYTEST_XDIST_AUTO_NUM_WORKERS`` set, xdist's
    own."""
    from conformance.plugins.scheduling import auto_workers, runs_the_suite

    if config.getoption(options.EMULATE_NPU):  # xdist asks before pytest_configure: the node it asks about
        _emulate_npu()
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.getoption(options.LAUNCHER) != "process" \
            or not runs_the_suite(config):
        return None
    kind = launching.process_kind(config)
    # Devices whose work is the host's (a CPU, the emulated NPU node) take workers by the cores: eight workers for
    # eight emulated cards on two cores took 2.2x the one process's time for the smoke tier.
    return auto_workers(0 if kind.computes_on_host else kind.count, options.available_cores())


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tell a launcher made before collection what the cases left to run need (:func:`launching.warm_ranks`)."""
    launching.warm_ranks(session)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse, once and up front, a ``--coc-impl`` that cannot be loaded or an unsupported megatron-core."""
    config = session.config
    if is_xdist_worker(config) or config.getoption("collectonly"):
        return  # xdist workers: the controller checked already
    from coc_shared.megatron_range import UnsupportedMegatron, check
    from conformance.harness.impl_loader import ImplementationLoadError, load_implementation
    from conformance.harness.launchers.devices import SharedDevicesError
    from conformance.protocol import DeclarationError, declarations

    try:
        check()
        declarations(load_implementation(impl_spec(config)), computed=False)
        _check_shared_devices(config)
    except (ImplementationLoadError, DeclarationError, UnsupportedMegatron, SharedDevicesError) as exc:
        raise pytest.UsageError(str(exc)) from None


def _check_shared_devices(config: pytest.Config) -> None:
    """Refuse ``--coc-ranks-per-device`` where ranks cannot share a device, before any case runs."""
    per_device = config.getoption(options.RANKS_PER_DEVICE)
    if per_device == 1:
        return
    from conformance.harness.launchers.devices import SharedDevicesError, detect_device_kind

    try:
        if config.getoption(options.LAUNCHER) != "process":
            raise SharedDevicesError("it needs the process launcher (ranks as processes bound to devices)")
        detect_device_kind(backend=config.getoption(options.BACKEND), ranks_per_device=per_device)
    except SharedDevicesError as exc:
        raise SharedDevicesError(f"{options.RANKS_PER_DEVICE} {per_device}: {exc}") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    launching.close_launcher(config)


@pytest.fixture(scope="session")
def coc_impl_spec(pytestconfig: pytest.Config) -> str:
    """``--coc-impl`` as given (ranks load the implementation from this string)."""
    return impl_spec(pytestconfig)


@pytest.fixture(scope="session")
def coc_impl(coc_impl_spec: str) -> Any:
    """The implementation under test, loaded in the pytest process."""
    from conformance.harness.impl_loader import load_implementation

    return load_implementation(coc_impl_spec)


@pytest.fixture(scope="session")
def coc_declarations(coc_impl: Any, pytestconfig: pytest.Config) -> Declarations:
    """What the implementation declares about itself (protocol v2), defaults filled in, for the device kind its
    ranks run on (thread ranks: the CPU)."""
    from conformance.protocol import declarations

    threads = pytestconfig.getoption(options.LAUNCHER) == "threaded"
    return declarations(coc_impl, device="cpu" if threads else launching.process_kind(pytestconfig).name)


@pytest.fixture
def coc_ranks(request: pytest.FixtureRequest) -> CaseRanks:
    """Run a rank task on N ranks: ``coc_ranks.run(fn, world_size, **params)`` (timed for this case)."""
    from conformance.caseids import needs
    from conformance.plugins.breaker import refuse_if_stormed
    from conformance.plugins.time_breakdown import case_timings

    node = request.node
    return launching.rank_runner(request.config).for_case(
        case_timings(node), before_run=lambda: refuse_if_stormed(node), exclusive=needs(node).exclusive)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a case the implementation cannot run (``coc_requires``), or one needing more devices than the
    node has (``docs/DESIGN.md#leases-and-node-size``): never started on fewer."""
    marks = list(item.iter_markers("coc_requires"))
    if marks:
        from conformance.harness.impl_loader import load_implementation, missing_capability
        from conformance.plugins.level_gate import skip_not_offered

        impl = load_implementation(impl_spec(item.config))
        for mark in marks:
            for capability in mark.args:
                reason = missing_capability(impl, capability)
                if reason:
                    skip_not_offered(item, reason)
    from conformance.caseids import needs, on_ranks

    if not on_ranks(item):
        return

    need = needs(item)
    devices = launching.node_devices(item.config) if need.world else None
    shortfall = None if devices is None else need.shortfall(devices)
    if shortfall:
        pytest.skip(shortfall)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A run asking for more ranks than the node has devices skips the case, saying so (never a crash)."""
    from conformance.caseids import on_ranks
    from conformance.harness.leases import LeaseUnsatisfiable

    try:
        return (yield)
    except LeaseUnsatisfiable as exc:
        if not on_ranks(item):
            raise
        pytest.skip(str(exc))


def pytest_report_header(config: pytest.Config) -> list[str]:
    launcher = config.getoption(options.LAUNCHER)
    lines = [f"coc-conformance: impl={impl_spec(config)} launcher={launcher} pid={os.getpid()}"]
    rank_server = launching.rank_server_header(config)
    if rank_server is not None:
        lines.append(rank_server)
    if not config.getoption(options.SAME_THREAD_BACKWARD):
        from conformance.plugins.scheduling import runs_the_suite

        if runs_the_suite(config):  # (torch is imported for it: not in every pytest session)
            from conformance.harness.device_thread import unavailable

            if unavailable():
                lines.append(f"coc-conformance: {unavailable()}")
    if launcher == "torchrun":
        from conformance.harness.launchers.torchrun import stacks_path

        lines.append(f"coc-conformance: a hang aborts the job; each rank's stacks go to {stacks_path('<rank>')}")
    return lines
