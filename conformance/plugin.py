"""pytest plugin (entry point ``pytest11``): options, fixtures and markers of the suite.

Loaded into every pytest run of an environment where the package is installed,
so it imports nothing heavy at load time: torch, launchers and the
implementation are imported when a fixture first needs them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conformance.launchers import Launcher
    from conformance.ranks import RankRunner

DEFAULT_IMPL = "coc_impl.reference:ReferenceCoC"

runner_key = pytest.StashKey["RankRunner"]()
launcher_key = pytest.StashKey["Launcher"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("coc-conformance", "CoC conformance suite")
    group.addoption(
        "--coc-impl", default=None, metavar="MODULE:ATTR",
        help=f"CoC implementation under test: an object, class or zero-arg callable "
        f"(default: ini coc_impl, else {DEFAULT_IMPL}).",
    )
    group.addoption(
        "--coc-launcher", default="process", choices=("process", "threaded", "torchrun"),
        help="How ranks run: warm gloo/nccl/hccl process pools (default), threads on torch's "
        "threaded process group (fast CPU numerics, no real overlap), or torchrun (every rank "
        "runs this session; multi-node).",
    )
    group.addoption(
        "--coc-backend", default=None,
        help="Collective backend for process ranks (default: hccl on NPU, nccl on CUDA, gloo on CPU).",
    )
    group.addoption(
        "--coc-case-timeout", type=float, default=120.0, metavar="SECONDS",
        help="A case not finished on every rank by then fails as a hang (default 120).",
    )
    group.addoption(
        "--coc-cpu-slots", type=int, default=8, metavar="N",
        help="CPU ranks allowed to run at once across all xdist workers of this machine (default 8).",
    )
    group.addoption(
        "--coc-max-live-ranks", type=int, default=None, metavar="N",
        help="Idle warm rank processes one pytest worker may keep (default: what fits in half "
        "the machine's memory shared by the xdist workers, at most 16).",
    )
    group.addoption(
        "--coc-lease-dir", default=None, metavar="DIR",
        help="Directory of device lease locks shared by all workers (default: per-user temp dir).",
    )
    group.addoption(
        "--coc-tp", default=None, metavar="SIZES",
        help="Comma-separated TP sizes to run (default: every size the case lists).",
    )
    parser.addini("coc_impl", "Default CoC implementation under test (MODULE:ATTR).", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "coc_requires(*capabilities): skip unless the "
                            "implementation under test provides these ops")
    config.addinivalue_line("markers", "perf: performance gate (exclusive device lease)")
    config.addinivalue_line("markers", "large: large shapes, not in the default CPU run")
    if config.getoption("allure_report_dir", None):  # allure-pytest writes results: describe the cases
        from conformance.allure_hooks import AllureHooks

        config.pluginmanager.register(AllureHooks(config), "coc-allure-hooks")


def impl_spec(config: pytest.Config) -> str:
    """The ``--coc-impl`` in force (option, then ini, then the reference)."""
    return config.getoption("--coc-impl") or config.getini("coc_impl") or DEFAULT_IMPL


#: Parameter names that hold a case's TP size (filtered by ``--coc-tp``).
TP_PARAMS = ("tp", "world_size")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect cases whose TP size ``--coc-tp`` does not name, or that torchrun cannot host."""
    raw = config.getoption("--coc-tp")
    chosen = {int(v) for v in raw.split(",") if v.strip()} if raw else None
    limit = int(os.environ.get("WORLD_SIZE", "1")) if config.getoption("--coc-launcher") == "torchrun" else None
    if chosen is None and limit is None:
        return
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        sizes = [params[p] for p in TP_PARAMS if isinstance(params.get(p), int)]
        unwanted = chosen is not None and not set(sizes) <= chosen
        too_big = limit is not None and any(size > limit for size in sizes)
        (drop if unwanted or too_big else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _make_launcher(config: pytest.Config) -> tuple[Launcher, Any]:
    from conformance.launchers.devices import cpu, detect
    from conformance.leases import DeviceLeases, default_lease_dir

    name = config.getoption("--coc-launcher")
    backend = config.getoption("--coc-backend")
    lease_dir = Path(config.getoption("--coc-lease-dir") or default_lease_dir())
    if name == "torchrun":
        from conformance.launchers.torchrun import TorchrunLauncher

        return TorchrunLauncher(backend), None
    if name == "threaded":
        from conformance.launchers.threaded import ThreadedLauncher

        kind = cpu(config.getoption("--coc-cpu-slots"))
        return ThreadedLauncher(), DeviceLeases(lease_dir, kind.lease_names())
    from conformance.launchers.process_pool import ProcessLauncher

    kind = detect(config.getoption("--coc-cpu-slots"), backend)
    max_live = config.getoption("--coc-max-live-ranks") or default_max_live_ranks()
    launcher = ProcessLauncher(kind, max_live_ranks=max_live)
    return launcher, DeviceLeases(lease_dir / kind.name, kind.lease_names())


#: Resident memory of one idle CPU rank (torch and megatron imported), measured here.
RANK_MEMORY_BYTES = 400 * 2**20


def default_max_live_ranks() -> int:
    """Warm ranks one worker keeps: half the memory, shared by the xdist workers, at most 16.

    Leases cap the ranks *running* at once; this caps the idle ones, so that
    ``pytest -n 8`` on a small machine keeps fewer pools warm instead of
    running out of memory (a pool above the budget is started per case).
    """
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(2, min(16, memory // 2 // RANK_MEMORY_BYTES // workers))


def rank_runner(config: pytest.Config) -> RankRunner:
    """The session's rank runner, created on first use."""
    if runner_key not in config.stash:
        from conformance.ranks import RankRunner

        launcher, leases = _make_launcher(config)
        config.stash[launcher_key] = launcher
        config.stash[runner_key] = RankRunner(
            launcher, leases, impl_spec(config),
            default_timeout=config.getoption("--coc-case-timeout"),
        )
    return config.stash[runner_key]


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
    from conformance.impl_loader import load_implementation

    return load_implementation(coc_impl_spec)


@pytest.fixture(scope="session")
def coc_ranks(pytestconfig: pytest.Config) -> RankRunner:
    """Run a case function on N ranks: ``coc_ranks.run(fn, world_size, **params)``."""
    return rank_runner(pytestconfig)


def pytest_runtest_setup(item: pytest.Item) -> None:
    marks = list(item.iter_markers("coc_requires"))
    if not marks:
        return
    from conformance.impl_loader import load_implementation, missing_capability

    impl = load_implementation(impl_spec(item.config))
    for mark in marks:
        for capability in mark.args:
            reason = missing_capability(impl, capability)
            if reason:
                pytest.skip(reason)


def pytest_report_header(config: pytest.Config) -> str:
    return (f"coc-conformance: impl={impl_spec(config)} launcher={config.getoption('--coc-launcher')}"
            f" pid={os.getpid()}")
