"""Where a rank's timed blocks synchronise its device: around the references, never between the op calls."""

from __future__ import annotations

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
    events: list[str] = []
    monkeypatch.setattr(case, "synchronize", lambda device: events.append("synchronise"))
    calling = op_cases.call_capturing_errors
    monkeypatch.setattr(op_cases, "call_capturing_errors",
                        lambda *args, **kwargs: (events.append("call"), calling(*args, **kwargs))[1])
    problems = (Problem(16, 32, 24, "float32", seed=1), Problem(16, 32, 24, "float32", seed=2))
    run = OpRun("matmul_all_reduce", problems, 2, runs=2, serial=True)
    launcher = ThreadedLauncher()
    try:
        outcomes = launcher.run(RankTask(op_task, 2, {"run": run}), (), DEFAULT_IMPL)
    finally:
        launcher.close()
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    first_call = events.index("call")
    assert events[:first_call] == ["synchronise"] * 4  # each rank's reference block, before any call
    assert events[first_call:] == ["call"] * 8, events  # 2 problems x 2 runs on each rank, none synchronised
