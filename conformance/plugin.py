"""pytest plugin (entry point ``pytest11``): the suite's options, fixtures and markers.

Loaded into every pytest run of an environment where the package is installed,
so it imports nothing heavy at load time: torch, launchers and the
implementation are imported when a fixture first needs them.  Each feature is
a small plugin module registered here (``conformance.plugins.*`` and, with
``--alluredir``, ``conformance.reporting.hooks``).
"""

from __future__ import annotations

__all__ = ["SUB_PLUGINS", "coc_declarations", "coc_impl", "coc_impl_spec", "coc_ranks", "default_max_live_ranks",
           "rank_backend", "rank_runner", "rank_server_address", "shared_rank_server"]

import os
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conformance import options
from conformance.case_kinds import KIND_MARKER
from conformance.options import impl_spec
from conformance.roster import is_xdist_worker

if TYPE_CHECKING:
    from conformance.harness.launchers import Launcher
    from conformance.harness.launchers.devices import DeviceKind
    from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher
    from conformance.harness.launchers.zygote_client import Zygote  # noqa: F401 - named by a stash key
    from conformance.harness.runner import CaseRanks, RankRunner
    from conformance.protocol import Declarations

runner_key = pytest.StashKey["RankRunner"]()
#: ``--coc-rank-server`` as decided once: the address to use, or why not (``(None, reason)``).
_shared_key = pytest.StashKey["tuple[str | None, str]"]()
#: The rank fork server :func:`prestart_ranks` started before this process imported torch.
_early_zygote_key = pytest.StashKey["Zygote"]()
launcher_key = pytest.StashKey["Launcher"]()

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

    from conformance.harness.case import guard_exits

    guard_exits()  # the implementation's code run in this process (configure, thread ranks) cannot end the run
    if not is_xdist_worker(config) and config.getoption(options.LAUNCHER) == "process":
        config.pluginmanager.register(_RankServerHooks(), "coc-rank-server")
    for name in SUB_PLUGINS:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.register(importlib.import_module(name), name)
    if config.getoption("allure_report_dir", None):  # allure-pytest writes results: describe the cases
        from conformance.reporting.hooks import AllureHooks

        config.pluginmanager.register(AllureHooks(config), "coc-allure-hooks")


def _emulate_npu() -> None:
    """``--coc-emulate-npu``: the emulated NPU node in this process and every one it starts, or a usage error."""
    from conformance.harness.launchers.devices import EmulatedNpuError, emulate_npu

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
    kind = _process_kind(config)
    # Devices whose work is the host's (a CPU, the emulated NPU node) take workers by the cores: eight workers for
    # eight emulated cards on two cores took 2.2x the one process's time for the smoke tier.
    return auto_workers(0 if kind.computes_on_host else kind.count, options.available_cores())


def _process_kind(config: pytest.Config) -> DeviceKind:
    """The device family the process launcher runs ranks on (the same in the controller and every worker)."""
    from conformance.harness.launchers.devices import detect_device_kind

    return detect_device_kind(config.getoption(options.CPU_SLOTS), config.getoption(options.BACKEND),
                              config.getoption(options.RANKS_PER_DEVICE))


def rank_backend(config: pytest.Config) -> str | None:
    """The collective backend the cases' ranks run on: the process launcher's (by device, or ``--coc-backend``),
    torch's threaded group, or the one torchrun's ranks are given (None: torch's default for their device)."""
    launcher = config.getoption(options.LAUNCHER)
    if launcher == "threaded":
        return "threaded"
    if launcher == "torchrun":
        given: str | None = config.getoption(options.BACKEND)
        return given
    return _process_kind(config).backend


def _make_launcher(config: pytest.Config) -> tuple[Launcher, Any]:
    from conformance.harness.launchers.devices import cpu
    from conformance.harness.leases import DeviceLeases, default_lease_dir

    name = config.getoption(options.LAUNCHER)
    backend = config.getoption(options.BACKEND)
    lease_dir = Path(config.getoption(options.LEASE_DIR) or default_lease_dir())
    if name == "torchrun":
        from conformance.harness.launchers.torchrun import TorchrunLauncher

        return TorchrunLauncher(backend), None
    if name == "threaded":
        from conformance.harness.launchers.threaded import ThreadedLauncher

        kind = cpu(config.getoption(options.CPU_SLOTS))
        return ThreadedLauncher(), DeviceLeases(lease_dir, kind.lease_names())
    from conformance.harness.launchers.zygote import MEGATRON
    from conformance.plugins.scheduling import needs_megatron_key

    kind = _process_kind(config)
    # Made before collection (prestart_ranks), it learns at its end whether layer cases need megatron-core.
    preload = MEGATRON if config.stash.get(needs_megatron_key, False) else ()
    workerinput = getattr(config, "workerinput", {})
    worker_server: str | None = workerinput.get(_RANK_SERVER)
    shared = None if worker_server else shared_rank_server(config)
    server = worker_server or shared
    launcher: Launcher
    if server:  # an xdist worker, or a session on another's rank server: that server runs its cases
        from conformance.harness.launchers.rank_server_client import ServerLauncher
        from conformance.harness.launchers.session_env import SessionEnv

        given = workerinput.get(_RANK_SESSION)
        session = SessionEnv(tuple(map(tuple, given[0])), given[1]) if given else SessionEnv.here() if shared else None
        launcher = ServerLauncher(server, preload, binds_devices=kind.binds_devices, session=session,
                                  releases=bool(shared))
    else:
        from conformance.harness.launchers.process_launcher import ProcessLauncher

        launcher = ProcessLauncher(kind, max_live_ranks=_max_live_ranks(config, kind), preload=preload,
                                   zygote=config.stash.get(_early_zygote_key, None))
    return launcher, DeviceLeases(lease_dir / kind.name, kind.lease_names(), slots_option=options.CPU_SLOTS
                                  if kind.name == "cpu" else None)


#: Resident memory of one idle CPU rank (torch and megatron imported), measured here.
RANK_MEMORY_BYTES = 400 * 2**20


def default_max_live_ranks(slots: int) -> int:
    """Rank processes the session keeps: three per device (or CPU slot), within half the machine's memory.

    Leases cap the ranks *running* at once at ``slots``; the rest of the
    budget keeps idle pools of the other world sizes warm.  On a small
    machine memory caps it instead (a pool above the budget is started per
    case).
    """
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 2**63
    return max(2, min(3 * slots, memory // 2 // RANK_MEMORY_BYTES))


def _max_live_ranks(config: pytest.Config, kind: DeviceKind) -> int:
    return config.getoption(options.MAX_LIVE_RANKS) or default_max_live_ranks(len(kind.lease_names()))


#: ``workerinput`` keys: the address of the rank server the workers use, and, where it is another session's
#: (``--coc-rank-server``), this session's environment (``SessionEnv`` fields), the same for every worker.
_RANK_SERVER = "coc_rank_server"
_RANK_SESSION = "coc_rank_session"


def rank_server_address(config: pytest.Config) -> str | None:
    """The address of the rank server an xdist worker runs its cases on (None outside a worker)."""
    return getattr(config, "workerinput", {}).get(_RANK_SERVER)


def shared_rank_server(config: pytest.Config) -> str | None:
    """``--coc-rank-server``, where this session may run its cases there (decided once: a refusal is a warning
    saying why, and the session starts ranks of its own)."""
    if _shared_key not in config.stash:
        address = config.getoption(options.RANK_SERVER)
        decided: tuple[str | None, str] = (None, "")
        if address and config.getoption(options.LAUNCHER) == "process":
            from conformance.harness.launchers.rank_server_client import why_not_shared

            reason = why_not_shared(address, _process_kind(config))
            decided = (None, reason) if reason else (address, "")
            if reason:
                config.issue_config_time_warning(pytest.PytestConfigWarning(
                    f"{options.RANK_SERVER} {address}: not used, {reason}; this session starts its own ranks"),
                    stacklevel=2)
        config.stash[_shared_key] = decided
    return config.stash[_shared_key][0]


class _RankServerHooks:
    """On the xdist controller: start the session's rank server for the first worker (or hand the workers the one
    ``--coc-rank-server`` names), stop it (or release this session's pools there) at the end."""

    def __init__(self) -> None:
        self.server: RankServer | None = None
        self.shared: ServerLauncher | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        if self.server is None and self.shared is None:
            from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher
            from conformance.harness.launchers.session_env import SessionEnv
            from conformance.plugins.scheduling import runs_the_suite

            shared = shared_rank_server(node.config)
            if shared:
                self.shared = ServerLauncher(shared, session=SessionEnv.here(), releases=True)
            else:
                kind = _process_kind(node.config)
                self.server = RankServer(kind, max_live_ranks=_max_live_ranks(node.config, kind))
            if runs_the_suite(node.config):  # its fork server imports torch while the workers start and collect
                client = self.shared or ServerLauncher(self.server.address if self.server else "")
                client.prestart()
                if client is not self.shared:
                    client.close()
        if self.shared is not None:
            assert self.shared.session is not None
            node.workerinput[_RANK_SERVER] = self.shared.address
            node.workerinput[_RANK_SESSION] = (self.shared.session.variables, self.shared.session.cwd)
        elif self.server is not None:
            node.workerinput[_RANK_SERVER] = self.server.address

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.shared is not None:
            self.shared.close()  # this session's idle pools there
            self.shared = None
        if self.server is not None:
            self.server.close()
            self.server = None


def rank_runner(config: pytest.Config) -> RankRunner:
    """The session's rank runner, created on first use."""
    if runner_key not in config.stash:
        from conformance.harness.runner import Budget, RankRunner

        launcher, leases = _make_launcher(config)
        config.stash[launcher_key] = launcher
        config.stash[runner_key] = RankRunner(
            launcher, leases, impl_spec(config),
            default_timeout=config.getoption(options.CASE_TIMEOUT),
            budget=Budget(config.getoption(options.BUDGET_FACTOR), config.getoption(options.BUDGET_FLOOR)),
            device_thread_backward=not config.getoption(options.SAME_THREAD_BACKWARD),
        )
    return config.stash[runner_key]


def prestart_ranks(config: pytest.Config) -> None:
    """Start the fork server of the process launcher's ranks now (it imports torch while pytest collects), where
    this process will run cases: not in an xdist controller, nor when only collecting.

    In one process the fork server starts before this process detects its
    devices (which imports torch wherever torch is built for GPUs), so the two
    import torch side by side.
    """
    if config.getoption(options.LAUNCHER) != "process" or config.getoption("collectonly") or (
            not is_xdist_worker(config) and getattr(config.option, "dist", "no") != "no"):
        return
    if not rank_server_address(config) and runner_key not in config.stash and not shared_rank_server(config):
        from conformance.harness.launchers.zygote_client import Zygote, can_fork_ranks

        if can_fork_ranks():
            config.stash[_early_zygote_key] = Zygote()
    rank_runner(config).launcher.prestart()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tell a launcher made before collection whether the rank fork server should import megatron-core, and
    which world sizes to start ranks of ahead of the cases (in the order the cases need them)."""
    from conformance.caseids import needs, on_ranks
    from conformance.harness.launchers.zygote import MEGATRON
    from conformance.plugins.scheduling import needs_megatron_key

    runner = session.config.stash.get(runner_key, None)
    if runner is None:
        return
    runner.launcher.want_preloaded(MEGATRON if session.config.stash.get(needs_megatron_key, False) else (),
                                   now=True)
    runner.launcher.warm([needs(item).world for item in session.items if on_ranks(item)])


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
    launcher = config.stash.get(launcher_key, None)
    if launcher is not None:
        launcher.close()


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
    return declarations(coc_impl, device="cpu" if threads else _process_kind(pytestconfig).name)


@pytest.fixture
def coc_ranks(request: pytest.FixtureRequest) -> CaseRanks:
    """Run a rank task on N ranks: ``coc_ranks.run(fn, world_size, **params)`` (timed for this case)."""
    from conformance.caseids import needs
    from conformance.plugins.breaker import refuse_if_stormed
    from conformance.plugins.time_breakdown import case_timings

    node = request.node
    return rank_runner(request.config).for_case(case_timings(node), before_run=lambda: refuse_if_stormed(node),
                                                exclusive=needs(node).exclusive)


def node_devices(config: pytest.Config) -> int | None:
    """How many ranks this node runs at once: its devices, or CPU slots (None under torchrun, whose job's
    ranks are the limit).  The leases hold exactly these, so a case is skipped by the same count that
    would refuse its lease."""
    leases = rank_runner(config).leases
    return None if leases is None else len(leases.devices)


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
    devices = node_devices(item.config) if need.world else None
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
    if config.getoption(options.RANK_SERVER) and launcher == "process":
        shared = shared_rank_server(config)
        lines.append(f"coc-conformance: ranks on the rank server at {shared}" if shared else
                     f"coc-conformance: {options.RANK_SERVER} not used ({config.stash[_shared_key][1]})")
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
