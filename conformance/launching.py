"""How the session's ranks are launched: the launcher chosen from the options and wired to the session.

``--coc-launcher`` picks the process pools (by default), thread ranks or
torchrun; for process ranks this module decides where they run (this
session's own pools, the xdist controller's rank server, or another session's
``--coc-rank-server``), which device family and how many live ranks, and
starts the rank fork server before pytest collects (:func:`prestart_ranks`).
The plugin (:mod:`conformance.plugin`) calls it from its hooks and fixtures;
the launchers themselves live in :mod:`conformance.harness.launchers`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conformance import options
from conformance.options import impl_spec
from conformance.roster import is_xdist_worker

if TYPE_CHECKING:
    from conformance.harness.launchers import Launcher
    from conformance.harness.launchers.devices import DeviceKind
    from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher
    from conformance.harness.launchers.zygote_client import Zygote  # noqa: F401 - named by a stash key
    from conformance.harness.runner import RankRunner

runner_key = pytest.StashKey["RankRunner"]()
#: ``--coc-rank-server`` as decided once: the address to use, or why not (``(None, reason)``).
_shared_key = pytest.StashKey["tuple[str | None, str]"]()
#: The rank fork server :func:`prestart_ranks` started before this process imported torch.
_early_zygote_key = pytest.StashKey["Zygote"]()
launcher_key = pytest.StashKey["Launcher"]()


def process_kind(config: pytest.Config) -> DeviceKind:
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
    return process_kind(config).backend


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

    kind = process_kind(config)
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

            reason = why_not_shared(address, process_kind(config))
            decided = (None, reason) if reason else (address, "")
            if reason:
                config.issue_config_time_warning(pytest.PytestConfigWarning(
                    f"{options.RANK_SERVER} {address}: not used, {reason}; this session starts its own ranks"),
                    stacklevel=2)
        config.stash[_shared_key] = decided
    return config.stash[_shared_key][0]


class RankServerHooks:
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
                kind = process_kind(node.config)
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


def warm_ranks(session: pytest.Session) -> None:
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


def close_launcher(config: pytest.Config) -> None:
    """Stop the session's launcher (its rank pools), if it made one."""
    launcher = config.stash.get(launcher_key, None)
    if launcher is not None:
        launcher.close()


def node_devices(config: pytest.Config) -> int | None:
    """How many ranks this node runs at once: its devices, or CPU slots (None under torchrun, whose job's
    ranks are the limit).  The leases hold exactly these, so a case is skipped by the same count that
    would refuse its lease."""
    leases = rank_runner(config).leases
    return None if leases is None else len(leases.devices)


def rank_server_header(config: pytest.Config) -> str | None:
    """The report header's line on ``--coc-rank-server``: the server the cases run on, or why it is not used."""
    if not config.getoption(options.RANK_SERVER) or config.getoption(options.LAUNCHER) != "process":
        return None
    shared = shared_rank_server(config)
    return f"coc-conformance: ranks on the rank server at {shared}" if shared else \
        f"coc-conformance: {options.RANK_SERVER} not used ({config.stash[_shared_key][1]})"
