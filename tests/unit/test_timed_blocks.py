"""Where a rank's timed blocks synchronise its device: around the references, never between the op calls."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from conformance.cases import op_cases
from conformance.cases.op_cases import op_task
from conformance.contract.jobs import OpRun
from conformance.contract.problems import Problem
from conformance.harness import case
from conformance.harness.case import RankTask
from conformance.harness.launchers.threaded import ThreadedLauncher
from conformance.options import DEFAULT_IMPL


def test_op_calls_run_back_to_back_without_a_device_synchronisation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A synchronisation between the calls would let each result finish before its copy is taken, hiding a result
    still being written when it was returned; the serial reference that sets the budget is timed synchronised."""
    events: dict[int, list[str]] = defaultdict(list)  # per rank thread: the ranks run side by side

    def note(event: str) -> None:
        events[threading.get_ident()].append(event)

    monkeypatch.setattr(case, "synchronize", lambda device: note("synchronise"))
    calling = op_cases.call_capturing_errors
    monkeypatch.setattr(op_cases, "call_capturing_errors",
                        lambda *args, **kwargs: (note("call"), calling(*args, **kwargs))[1])
    problems = (Problem(16, 32, 24, "float32", seed=1), Problem(16, 32, 24, "float32", seed=2))
    run = OpRun("matmul_all_reduce", problems, 2, runs=2, serial=True)
    launcher = ThreadedLauncher()
    try:
        outcomes = launcher.run(RankTask(op_task, 2, {"run": run}), (), DEFAULT_IMPL)
    finally:
        launcher.close()
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    # each rank: its reference block's two edges, then 2 problems x 2 runs back to back, none synchronised
    assert list(events.values()) == [["synchronise"] * 2 + ["call"] * 4] * 2, dict(events)
