"""The probes see every collective however it was reached, its wait, its group, and what each matmul multiplies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance.contract.results import ObservedCollective, ObservedCollectives, ObservedMatmul
from conformance.harness.case import RankTask
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.judge.structure import PartMatmuls, check_phase
from conformance.protocol import Chunked
from conformance.record.verdicts import NotJudged
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
                                        "'helper'.: the timeline is incomplete"):
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
        # waiting on the future a callback chains completes what the callback waited for, inline or not
        assert seen["collective in a callback"] == seen["collective in an inline callback"] == [True, True], seen
        # a callback registered before the recording that runs during it: watched (decided when it runs)
        assert len(seen["callback registered before"]) == 1, seen  # type: ignore[arg-type]
        assert "'coc-completer'" in seen["callback registered before"][0], seen  # type: ignore[index]


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


def test_a_recordings_nesting_of_entry_points_is_its_own_on_each_thread() -> None:
    """Threads carrying one recording (the device thread, a callback's) each have their own nesting of
    ``torch.distributed`` entry points: one thread inside ``all_reduce(async_op=False)`` never makes another
    thread's collective look called through it (blocking, on its group)."""
    import threading

    from conformance.harness.probes.collective_log import CollectiveLog
    from conformance.harness.probes.recordings import Recording

    recording = Recording(CollectiveLog(), None, None)
    recording.api_stack().append(("all_reduce", False, None))
    seen: list[object] = []
    other = threading.Thread(target=lambda: seen.append(list(recording.api_stack())))
    other.start()
    other.join()
    assert seen == [[]] and recording.api_stack() == [("all_reduce", False, None)]


def _column_sp(forward: ObservedCollectives, backward: ObservedCollectives) -> list[Any]:
    from conformance.contract.results import LayerOutcome

    return [LayerOutcome(None, [], timelines={"column/forward": forward, "column/backward": backward})]


_CHUNKED_GATHER = ObservedCollectives(tuple(
    ObservedCollective("all_gather", "c10d._allgather_base_", None, True, (0, 1), ((4,),),
                       (ObservedMatmul((4, 4), frozenset({"w"})),), False) for _ in range(2)))
_SERIAL_SCATTER = ObservedCollectives((ObservedCollective("reduce_scatter", "c10d._reduce_scatter_base_", None,
                                                          False, (0, 1), ((4,),), (), False),))
_HELPER_MATMUL = replace(_CHUNKED_GATHER, other_thread_matmuls=("aten.mm in helper thread 'helper'",))


def test_structure_is_judged_phase_by_phase_one_unseen_phase_hides_no_other() -> None:
    """A helper thread's matmul in the forward leaves that phase not judged; the backward, declared chunked and
    serial, still fails (issue 50: the first phase not judged ended the check 'not judged')."""
    from conformance.contract.problems import LayerProblem
    from conformance.judge.structure import check_layer_structure
    from conformance.record.failures import StructureMismatch

    problem = LayerProblem("column", True, 8, 8, "float32")
    declared = {"column/sp/forward": Chunked(), "column/sp/backward": Chunked()}
    with pytest.raises(StructureMismatch, match=r"(?s)column/sp/backward: declared chunked.*not judged: rank 0: "
                                                r"column/sp/forward: .*helper thread 'helper'"):
        check_layer_structure(problem, _column_sp(_HELPER_MATMUL, _SERIAL_SCATTER), declared, chunks=2, tp=2)
    chunked_scatter = ObservedCollectives(tuple(replace(c, kind="reduce_scatter") for c in _CHUNKED_GATHER.collectives))
    with pytest.raises(NotJudged, match="column/sp/forward: .*every other phase overlapped as declared"):
        check_layer_structure(problem, _column_sp(_HELPER_MATMUL, chunked_scatter), declared, chunks=2, tp=2)
    check_layer_structure(problem, _column_sp(_CHUNKED_GATHER, chunked_scatter), declared, chunks=2, tp=2)


def test_a_saved_gather_is_honoured_only_where_the_backward_is_seen_whole() -> None:
    """``recompute_all_gather=False``: a re-gather seen fails; none seen while a helper thread issued collectives in
    the backward is not judged, never passed."""
    from conformance.judge.layers import check_saved_gather
    from conformance.record.failures import WrongError

    unseen = ObservedCollectives((), other_threads=("all_gather_into_tensor on thread 'coc-regather'",))
    with pytest.raises(NotJudged, match="coc-regather"):
        check_saved_gather(_column_sp(_CHUNKED_GATHER, unseen))
    with pytest.raises(WrongError, match="all-gathered its input again"):
        check_saved_gather(_column_sp(_CHUNKED_GATHER, replace(_CHUNKED_GATHER, other_threads=unseen.other_threads)))
    check_saved_gather(_column_sp(_CHUNKED_GATHER, _SERIAL_SCATTER))
