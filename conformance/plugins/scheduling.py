"""Which cases run, and in what order: ``--coc-tp``, torchrun's world size, warm pools.

Every distributed case names its sizes as parameters (``tp``, ``world_size``,
``world`` when its TP group is a proper subgroup, or a perf case's ``tp``),
read by the one :func:`conformance.caseids.needs`, so the choice is made
here, at collection, never in a test body.

Order (``docs/DESIGN.md#scheduling``): cases on rank pools are sorted by the
world size they need (then their TP size), stably, after every other test, so
each xdist worker runs its cases of one size together and keeps that pool
warm, and the whole-node cases (TP 8, perf) come last instead of interleaving
with small ones across workers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance import options
from conformance.caseids import SUITE_DIR, Needs, in_suite, needs, on_ranks

#: Whether the collected cases include layer cases (the rank fork server then preloads megatron-core).
needs_megatron_key = pytest.StashKey[bool]()


def builds_megatron_state(item: pytest.Item) -> bool:
    """Whether the case runs (or, as the explorer, may run) real Megatron layers, which initialise Megatron's
    parallel state."""
    return any("patch_megatron" in mark.args for mark in item.iter_markers("coc_requires")) or \
        item.get_closest_marker("coc_builds_megatron") is not None


#: CPU cores per xdist worker for ``-n auto`` on the suite, and the fewest cores on which workers pay for
#: themselves: each is a pytest process that imports and collects (seconds of CPU), one worker's cases already
#: keep more than a core busy with their ranks, and CPU ranks spend most of their time waiting on each other,
#: so more workers add lease waits rather than throughput (``docs/DESIGN.md#workers``).
CORES_PER_WORKER = 4
MIN_CORES_FOR_WORKERS = 8


def auto_workers(accelerators: int, cores: int) -> int:
    """Workers for ``-n auto`` on the suite: one per accelerator; on CPU one per :data:`CORES_PER_WORKER`
    cores, none below :data:`MIN_CORES_FOR_WORKERS` (the run stays in one process)."""
    if accelerators:
        return accelerators
    return cores // CORES_PER_WORKER if cores >= MIN_CORES_FOR_WORKERS else 0


def runs_the_suite(config: pytest.Config) -> bool:
    """Whether the command line names the conformance suite (or part of it), as a path or with ``--pyargs``."""
    for arg in config.args:
        target = str(arg).split("::", 1)[0]
        if config.getoption("pyargs", False) and (target == "conformance.suite"
                                                  or target.startswith("conformance.suite.")):
            return True
        path = Path(config.invocation_params.dir, target)
        if path.resolve() == SUITE_DIR or (path.suffix == ".py" and in_suite(path)):
            return True
    return False


def rank_order(need: Needs) -> tuple[bool, int, int]:
    """Sort key of a case on rank pools: perf cases last, then by world size, then by TP size (its world when
    it names none).  The suite's order and the schedule simulation (``conformance.bench.schedule``) both sort
    by it."""
    return need.exclusive, need.world, min(need.tps, default=need.world)


def order(item: pytest.Item) -> tuple[bool, int, int]:
    """:func:`rank_order` of a collected case."""
    return rank_order(needs(item))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the smoke tier; deselect what ``--coc-tp`` leaves out or torchrun cannot host; order the rest."""
    from conformance.caseids import case_id
    from conformance.tiers import in_smoke

    for item in items:
        if in_suite(item.path) and in_smoke(case_id(item.nodeid)):
            item.add_marker(pytest.mark.smoke)
    chosen = config.getoption(options.TP)
    limit = int(os.environ.get("WORLD_SIZE", "1")) if config.getoption(options.LAUNCHER) == "torchrun" else None
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        need = needs(item)
        unwanted = chosen is not None and not need.tps <= chosen
        # Under torchrun a case runs on exactly the job's ranks: creating a process group
        # (Megatron's, a TP subgroup, the implementation's own) is collective over them all.
        elsewhere = limit is not None and need.world not in (0, limit)
        (drop if unwanted or elsewhere else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # Only cases on rank pools move; everything else keeps its place (and its module fixtures).
    ranked = sorted((item for item in keep if on_ranks(item)), key=order)
    items[:] = [item for item in keep if not on_ranks(item)] + ranked


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Whether the cases left to run (after ``-m`` and ``-k``) build Megatron's state: the rank fork server then
    imports megatron-core (seconds before the first rank can start)."""
    session.config.stash[needs_megatron_key] = any(
        builds_megatron_state(item) for item in session.items if on_ranks(item))
