"""The probes see every collective however it was reached, its wait, its group, and what each matmul multiplies."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.contract.results import ObservedCollective, ObservedCollectives
from conformance.harness.case import RankTask
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.judge.structure import PartMatmuls, check_phase
from conformance.judge.verdicts import NotJudged
from conformance.protocol import Chunked
from tests.support import rank_cases

IMPL = "coc_impl.reference:ReferenceCoC"


def test_collectives_through_an_alias_bound_before_the_probes_are_seen_launched_and_waited(
        pool: ProcessLauncher) -> None:
    for outcome in pool.run(RankTask(rank_cases.through_an_alias, 2), (), IMPL):
        seen = outcome.value
        assert seen["calls"] == [
            ("all_reduce", True, False, "live"),  # waited through the handle the alias returned
            ("all_gather", False, False, "live"),
            ("all_reduce", False, False, "gone"),  # destroyed after a recording saw it alive
            ("all_reduce", False, False, "unknown"),  # destroyed before any recording saw it
            ("all_reduce", True, True, "live"),  # still in flight when the recording ended
        ]
        assert seen["overlapped"] == [[((4, 4), ["w"])]]  # the matmul before the wait, known by its operand
        assert seen["gone_ranks"] == (0, 1)
        assert seen["completed"] == 4


def test_every_wait_is_seen_nothing_is_counted_twice_or_invented_and_a_helper_threads_collective_is_named(
        pool: ProcessLauncher) -> None:
    for outcome in pool.run(RankTask(rank_cases.probe_corners, 2), (), IMPL):
        assert outcome.error is None, outcome.error.traceback  # type: ignore[union-attr]
        seen = outcome.value
        assert seen["p2pop"] == "ok"  # isend keeps its identity
        assert seen["functional"] == ["_c10d_functional.all_reduce"]  # no phantom _wrap_tensor_autograd
        for how in ("get_future().wait()", "torch.futures.wait_all", "synchronize()",
                    "all_reduce_coalesced"):
            assert seen[how] == [True], (how, seen[how])
        assert seen["coalescing_manager"] == [("all_reduce", True)]  # queued calls issued once, coalesced
        assert seen["phase_overlapped"] == [[(2, 2)]]  # never waited: in flight to its phase's end only
        # named with its thread, once (not again by the process group's method or the dispatcher under it)
        assert seen["helper_thread"] == ("all_reduce on thread 'coc-helper'",)


def test_a_phase_with_a_helper_threads_collective_is_not_judged_for_structure() -> None:
    """Serial as recorded, but a collective came from another thread: not judged, never a false "serial"."""
    serial = ObservedCollective("all_gather", "c10d._allgather_base_", None, False, (0, 1), ((4,),), (), False)
    timeline = ObservedCollectives((serial,), other_threads=("all_gather_into_tensor on thread 'helper'",))
    with pytest.raises(NotJudged, match="on a thread the probes cannot follow .all_gather_into_tensor on thread "
                                        "'helper'.: the phase's timeline is incomplete"):
        check_phase(timeline, "column/sp/forward", Chunked(), chunks=1, matmuls=PartMatmuls("w", (4, 4)))


def test_a_backward_on_the_device_thread_is_recorded_like_the_recording_thread(pool: ProcessLauncher) -> None:
    """The CPU emulation of the autograd engine's device thread: the probes' old thread-locals crash there (as they
    did on a GPU), the probes follow the dispatch mode there, and the rank's completions count for it."""
    for off_thread, thread in ((True, "coc-backward"), (False, "MainThread")):
        for outcome in pool.run(RankTask(rank_cases.backward_on_device_thread, 2, {"off_thread": off_thread}),
                                (), IMPL):
            assert outcome.error is None, outcome.error.traceback  # type: ignore[union-attr]
            seen = outcome.value
            assert seen["threads"] == [thread]
            assert seen["calls"] == [("all_reduce", True, False)]  # launched, and waited, on that thread
            assert seen["overlapped"] == [[(2, 3)]]  # the weight gradient, in flight with it
            assert seen["other_threads"] == ((), ())  # judged like the recording thread, never "another thread"
            assert seen["completed_for_rank"]
            if off_thread:
                assert "has no attribute 'api_stack'" in seen["old_probe"], seen["old_probe"]
            else:
                assert seen["old_probe"] is None  # a CPU's own backward never met it


def test_every_documented_wait_is_a_wait_whichever_thread_waits(pool: ProcessLauncher) -> None:
    for outcome in pool.run(RankTask(rank_cases.every_wait_style, 2), (), IMPL):
        assert outcome.error is None, outcome.error.traceback  # type: ignore[union-attr]
        seen = outcome.value
        for how in ("collect_all", "then", "then then", "wait_all", "Future.wait",
                    "Future.done polled", "Work.is_completed polled", "on another thread"):
            assert seen[how] == [True, True], (how, seen[how])
        assert seen["callback only"] == [False]  # a callback runs because the future is done: no wait of the program
        assert seen["callback matmul"] == ([(3, 3)], ())  # the callback carries the recording's mode
        assert seen["helper matmul"] == ((), ("aten.mm in helper thread 'coc-helper'",))  # no collective


def _every_wait_style_on_npus(rank: int, world: int) -> dict[str, object]:
    from types import SimpleNamespace

    import torch.distributed as dist

    return rank_cases.every_wait_style(SimpleNamespace(group=dist.group.WORLD, device="npu"))  # type: ignore[arg-type]


def test_every_documented_wait_is_a_wait_on_a_work_written_in_python(tmp_path: Path) -> None:
    """The emulated NPU's hccl Work is a Python subclass of dist.Work (as any Python backend's): through the probes'
    wrappers every wait is still a wait, and taking a future still works (a wrapper named get_future made pybind11
    skip the override: "Work::getFuture not implemented")."""
    from npu_sim.testing import run_ranks

    for seen in run_ranks(_every_wait_style_on_npus, 2, tmp_path, timeout=120):
        for how in ("collect_all", "then", "then then", "wait_all", "Future.wait",
                    "Future.done polled", "Work.is_completed polled", "on another thread"):
            assert seen[how] == [True, True], (how, seen[how])
        assert seen["callback only"] == [False]


def test_a_phase_with_a_helper_threads_matmul_is_not_judged_and_issued_no_collective() -> None:
    serial = ObservedCollective("all_gather", "c10d._allgather_base_", None, False, (0, 1), ((4,),), (), False)
    timeline = ObservedCollectives((serial,), other_thread_matmuls=("aten.mm in helper thread 'helper'",))
    assert timeline.other_threads == ()  # a refusal after it came before any collective
    with pytest.raises(NotJudged, match="aten.mm in helper thread 'helper'"):
        check_phase(timeline, "column/sp/forward", Chunked(), chunks=1, matmuls=PartMatmuls("w", (4, 4)))
