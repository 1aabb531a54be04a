"""The launchers: results, rank errors, hangs and crashes, recovery.

Verdicts are judged by what they say, not by a wall clock: a bound on how
long a verdict took is relative to a trivial run in the same pool, measured
in the same test (a loaded machine slows both).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.harness import wire
from conformance.harness.case import RankTask
from conformance.harness.case_errors import CaseTimeout, RankCrashed, RankRaised
from conformance.harness.launchers import Launcher, rank_server_client
from conformance.harness.launchers.devices import cpu
from conformance.harness.launchers.process_launcher import ProcessLauncher
from conformance.harness.launchers.rank_server_client import RankServer, ServerLauncher, why_not_shared
from conformance.harness.launchers.session_env import SessionEnv
from conformance.harness.launchers.threaded import ThreadedLauncher
from conformance.harness.runner import RankRunner
from tests.support import ROOT, rank_cases

IMPL = "coc_impl.reference:ReferenceCoC"


def test_collective_results_per_rank(launcher: Launcher) -> None:
    outcomes = launcher.run(RankTask(rank_cases.rank_sum, 4, {"n": 3}), (), IMPL)
    assert [o.rank for o in outcomes] == [0, 1, 2, 3]
    assert all(o.value == [6.0, 6.0, 6.0] for o in outcomes)


def test_context_names_rank_world_and_launcher(launcher: Launcher) -> None:
    outcomes = launcher.run(RankTask(rank_cases.whoami, 2), (), IMPL)
    assert [o.value for o in outcomes] == [(0, 2, launcher.name), (1, 2, launcher.name)]


def test_rank_errors_come_back_with_tracebacks(launcher: Launcher) -> None:
    runner = RankRunner(launcher, None, IMPL)
    with pytest.raises(RankRaised) as info:
        runner.run(rank_cases.every_rank_raises, 2)
    errors = [o.error for o in info.value.outcomes]
    assert [e.type_name for e in errors if e] == ["builtins.KeyError"] * 2
    assert "every_rank_raises" in errors[1].traceback
    assert isinstance(errors[0].exception, KeyError)


def test_rank_logs_are_captured_per_rank(launcher: Launcher) -> None:
    outcomes = launcher.run(RankTask(rank_cases.logs_and_prints, 2), (), IMPL)
    assert "rank 0 logged" in outcomes[0].log and "rank 1" not in outcomes[0].log
    assert "rank 1 logged" in outcomes[1].log


def trivial_run_s(launcher: Launcher, world_size: int) -> float:
    """Seconds a trivial task takes on a warm pool of ``world_size``: how slow the machine is right now."""
    launcher.run(RankTask(rank_cases.rank_sum, world_size), (), IMPL)  # warm: the pool's start is no measure
    start = time.monotonic()
    launcher.run(RankTask(rank_cases.rank_sum, world_size), (), IMPL)
    return time.monotonic() - start


def slack_s(trivial_s: float) -> float:
    """What a verdict may take beyond its limit: stack dumps and a pool's teardown, scaled by the machine's pace."""
    return 10.0 + 50 * trivial_s


def timed_verdict(launcher: Launcher, task: RankTask,
                  error: type[BaseException]) -> tuple[pytest.ExceptionInfo[BaseException], float, float]:
    """Run ``task`` expecting ``error``: the verdict, its wall time, and a trivial run's time in the same pool."""
    trivial = trivial_run_s(launcher, task.world_size)
    start = time.monotonic()
    with pytest.raises(error) as info:
        launcher.run(task, (), IMPL)
    elapsed = time.monotonic() - start
    print(f"{launcher.name}: {error.__name__} after {elapsed:.2f} s (ceiling {task.timeout:g} s; "
          f"a trivial run took {trivial:.3f} s)")
    return info, elapsed, trivial


def test_rank_left_waiting_is_a_hang_and_next_case_passes(
    launcher: Launcher,
) -> None:
    info, elapsed, trivial = timed_verdict(launcher, RankTask(rank_cases.rank0_raises_others_wait, 4, timeout=3.0),
                                           CaseTimeout)
    assert elapsed < 3.0 + slack_s(trivial)
    text = str(info.value)
    assert "only rank 0 saw bad input" in text  # the rank that raised is named with its error
    if launcher.name == "process":
        # Every still-running rank's Python stack shows where it waits.
        assert {1, 2, 3} <= set(info.value.stacks)
        assert all("all_reduce" in info.value.stacks[r] for r in (1, 2, 3))
    outcomes = launcher.run(RankTask(rank_cases.rank_sum, 4), (), IMPL)
    assert outcomes[0].value == [6.0] * 4


def test_hung_case_fails_within_timeout_with_stacks(launcher: Launcher) -> None:
    info, elapsed, trivial = timed_verdict(launcher, RankTask(rank_cases.sleep_forever, 2, timeout=1.5), CaseTimeout)
    assert re.search(r"did not finish within 1.5 s \(the case's ceiling\)", str(info.value))
    assert 1.5 <= elapsed < 1.5 + slack_s(trivial)
    assert all("sleep_forever" in info.value.stacks[r] for r in (0, 1))
    if launcher.name == "process":
        assert launcher.run(RankTask(rank_cases.rank_sum, 2), (), IMPL)[1].value == [1.0] * 4


def test_dead_rank_fails_the_case_and_pool_is_rebuilt(pool_launcher: Launcher) -> None:
    """Noticed when the rank dies: waiting for the ceiling would be a CaseTimeout, and the survivor sleeps 60 s."""
    info, elapsed, trivial = timed_verdict(pool_launcher, RankTask(rank_cases.rank1_dies, 2, timeout=30.0), RankCrashed)
    assert elapsed < slack_s(trivial), "a dead rank must not wait for the case timeout"
    assert "exit code 7" in str(info.value)
    assert "rank 1 about to exit" in info.value.stacks[1]
    assert "rank1_dies" in info.value.stacks[0]  # the survivor's stack
    assert pool_launcher.run(RankTask(rank_cases.rank_sum, 2), (), IMPL)[0].value == [1.0] * 4


def test_rank_killed_by_a_signal_says_where(pool_launcher: Launcher) -> None:
    """A rank that dies of a fatal signal (a crash in native code) leaves its Python stack in the verdict."""
    info, _, _ = timed_verdict(pool_launcher, RankTask(rank_cases.rank1_segfaults, 2, timeout=30.0), RankCrashed)
    assert "exit code -11" in str(info.value)
    assert "Segmentation fault" in info.value.stacks[1]
    assert "rank1_segfaults" in info.value.stacks[1]
    assert pool_launcher.run(RankTask(rank_cases.rank_sum, 2), (), IMPL)[0].value == [1.0] * 4


def test_unpicklable_result_is_that_ranks_error(pool_launcher: Launcher) -> None:
    outcomes = pool_launcher.run(RankTask(rank_cases.unpicklable_result, 2), (), IMPL)
    assert all(o.error is not None and "pickle" in o.error.message for o in outcomes)
    assert pool_launcher.run(RankTask(rank_cases.whoami, 2), (), IMPL)[0].value == (0, 2, "process")


def test_pools_are_warm_and_bounded(pool: ProcessLauncher) -> None:
    pids = [o.value for o in pool.run(RankTask(rank_cases.pid, 2), (), IMPL)]
    assert [o.value for o in pool.run(RankTask(rank_cases.pid, 2), (), IMPL)] == pids, "pool not reused"
    pool.run(RankTask(rank_cases.whoami, 8), (), IMPL)  # 2 + 8 > max_live_ranks=8: evicts size 2
    assert sum(key.world_size for key, _ in pool._idle) <= 8
    assert [o.value for o in pool.run(RankTask(rank_cases.pid, 2), (), IMPL)] != pids


@pytest.mark.parametrize("use_async", [True, False])
def test_probe_sees_collectives_on_every_launcher(
    launcher: Launcher, use_async: bool,
) -> None:
    outcomes = launcher.run(
        RankTask(rank_cases.count_collectives, 2, {"chunks": 3, "use_async": use_async}), (), IMPL)
    for outcome in outcomes:
        assert outcome.value == [("all_reduce", use_async, use_async)] * 3 + [("all_gather", False, False)]


def test_workers_share_the_servers_warm_pools(rank_server: RankServer) -> None:
    """Two workers' cases of one size, one after the other, run on the same ranks: one pool start for both."""
    first, second = ServerLauncher(rank_server.address), ServerLauncher(rank_server.address)
    try:
        pids = [o.value for o in first.run(RankTask(rank_cases.pid, 3), (), IMPL)]
        started = first.pools_started()
        assert [o.value for o in second.run(RankTask(rank_cases.pid, 3), (), IMPL)] == pids
        assert second.last_start_s == 0.0
        assert second.pools_started() == started
    finally:
        first.close()
        second.close()


def test_a_hung_case_on_the_server_costs_only_its_own_ranks(rank_server: RankServer, tmp_path: Path) -> None:
    """While one worker's case hangs and its pool is torn down, another worker's cases run on their own pool."""
    hanging, working = ServerLauncher(rank_server.address), ServerLauncher(rank_server.address)
    verdict: list[BaseException] = []
    said = tmp_path / "hung-rank-"

    def hang() -> None:
        try:
            hanging.run(RankTask(rank_cases.say_then_sleep_forever, 2, {"path": str(said)}, timeout=3.0), (), IMPL)
        except CaseTimeout as exc:
            verdict.append(exc)

    try:
        thread = threading.Thread(target=hang)
        thread.start()
        deadline = time.monotonic() + 60
        while not all(Path(f"{said}{rank}").exists() for rank in range(2)) and time.monotonic() < deadline:
            time.sleep(0.01)  # the hanging case holds its ranks: the working one cannot take them
        mine = [o.value for o in working.run(RankTask(rank_cases.pid, 2), (), IMPL)]
        hung = [int(Path(f"{said}{rank}").read_text()) for rank in range(2)]
        assert not set(mine) & set(hung)
        sums = []
        while thread.is_alive():
            sums.append(working.run(RankTask(rank_cases.rank_sum, 2), (), IMPL)[1].value)
        thread.join()
        assert verdict and "say_then_sleep_forever" in verdict[0].stacks[0]
        assert sums and all(value == [1.0] * 4 for value in sums)
        assert [o.value for o in working.run(RankTask(rank_cases.pid, 2), (), IMPL)] == mine
    finally:
        hanging.close()
        working.close()


def _session(tmp_path: Path, name: str) -> SessionEnv:
    """A session environment of its own: a marker variable and a working directory named ``name``."""
    (tmp_path / name).mkdir()
    return SessionEnv.of({**os.environ, "COC_TEST_SESSION": name}, str(tmp_path / name), sys.path)


def test_sessions_sharing_a_server_run_on_pools_of_their_own_in_their_own_environment(
        rank_server: RankServer, tmp_path: Path) -> None:
    """Two sessions on one server (``--coc-rank-server``): each case sees its session's environment and working
    directory, never the other's ranks; a session's pools stay warm for it until it ends."""
    sessions = {name: ServerLauncher(rank_server.address, session=_session(tmp_path, name), releases=True)
                for name in ("a", "b")}
    task = RankTask(rank_cases.surroundings, 2, {"variable": "COC_TEST_SESSION", "module": "tabnanny"})
    try:
        seen = {name: launcher.run(task, (), IMPL) for name, launcher in sessions.items()}
        for name, outcomes in seen.items():
            assert {o.value[1:3] for o in outcomes} == {(name, str(tmp_path / name))}
        pids = {name: {o.value[0] for o in outcomes} for name, outcomes in seen.items()}
        assert not pids["a"] & pids["b"]
        assert {o.value[0] for o in sessions["a"].run(task, (), IMPL)} == pids["a"]  # warm, and still its own
        assert {o.value[0] for o in sessions["b"].run(task, (), IMPL)} == pids["b"]
        sessions["a"].close()  # the session ended: its idle pools are closed
        deadline = time.monotonic() + 10
        while any(_running(p) for p in pids["a"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(p) for p in pids["a"])
    finally:
        for launcher in sessions.values():
            launcher.close()


def test_modules_named_after_the_fork_server_began_are_imported_before_its_next_fork() -> None:
    """A shared server's fork server began with the first session's modules; a later session that names more (as
    a layer case names megatron-core) has its ranks forked only once they are imported."""
    launcher = ProcessLauncher(cpu(4), max_live_ranks=8)
    task = {"variable": "COC_TEST_SESSION", "module": "tabnanny"}
    try:
        launcher.want_preloaded((), now=True)
        assert not any(o.value[3] for o in launcher.run(RankTask(rank_cases.surroundings, 2, task), (), IMPL))
        launcher.want_preloaded(["tabnanny"], now=True)
        assert all(o.value[3] for o in launcher.run(RankTask(rank_cases.surroundings, 3, task), (), IMPL))
    finally:
        launcher.close()


def test_a_pool_unused_since_its_last_case_retires_and_one_warmed_ahead_waits_for_its_first() -> None:
    """Idle ranks cost CPU (gloo wakes every 10 ms per group): a pool that served its cases and has been idle for
    ``retire_idle_s`` is closed at the next case; a pool started ahead of its cases is kept until it has run one."""
    launcher = ProcessLauncher(cpu(8), max_live_ranks=16, retire_idle_s=0.5)
    try:
        launcher.warm([3])
        first = [o.value for o in launcher.run(RankTask(rank_cases.pid, 2), (), IMPL)]
        time.sleep(1.0)
        assert [o.value for o in launcher.run(RankTask(rank_cases.pid, 1), (), IMPL)]  # its check-in retires size 2
        deadline = time.monotonic() + 10
        while any(_running(p) for p in first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(p) for p in first)
        while launcher.pools_started() < 3 and time.monotonic() < deadline:  # 2, 1 and the one warmed ahead
            time.sleep(0.05)
        launcher.run(RankTask(rank_cases.pid, 3), (), IMPL)  # warmed, idle since, never used: still warm
        assert launcher.last_start_s == 0.0 and launcher.pools_started() == 3
    finally:
        launcher.close()


def test_a_session_shares_only_a_server_that_runs_its_code_on_its_devices(
        rank_server: RankServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert why_not_shared(rank_server.address, cpu(2)) is None  # the slots are each session's own leases
    assert "runs cpu ranks over gloo" in str(why_not_shared(rank_server.address, cpu(8, "nccl")))
    assert "no rank server answers" in str(why_not_shared(str(tmp_path / "none.sock"), cpu(8)))
    monkeypatch.setattr(rank_server_client, "code_key", lambda: "an edited checkout")
    assert "other code" in str(why_not_shared(rank_server.address, cpu(8)))


def test_closing_the_server_stops_every_rank() -> None:
    server = RankServer(cpu(4), max_live_ranks=4)
    launcher = ServerLauncher(server.address)
    pids = [o.value for o in launcher.run(RankTask(rank_cases.pid, 2), (), IMPL)]
    launcher.close()
    server.close()
    deadline = time.monotonic() + 10
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(p) for p in pids)
    with pytest.raises(RankCrashed, match="rank server .* is gone"):
        ServerLauncher(server.address).run(RankTask(rank_cases.pid, 2), (), IMPL)


def test_the_server_forwards_a_tasks_call_unread(tmp_path: Path) -> None:
    """A worker's task reaches the ranks with its call (function, parameters: tensors too) as the worker pickled
    it: the server reads neither, and so imports no torch for it (seconds of CPU while the session starts)."""
    import subprocess

    import torch

    task = RankTask(rank_cases.pid, 2, {"x": torch.arange(6.0).view(2, 3)})
    request = ServerLauncher(str(tmp_path / "no-server")).run_request(task, (), IMPL)
    (tmp_path / "request").write_bytes(wire.dumps(request))
    script = f"""
import pickle, sys
from pathlib import Path
from conformance.harness.launchers import rank_server

class Forwarding:
    last_start_s = 0.0
    def want_preloaded(self, *_): pass
    def run(self, task, *_, **__):
        print("call" if task.call == {task.pickled().call!r} and task.params == {{}} else "changed")
        return []

request = pickle.loads(Path({str(tmp_path / "request")!r}).read_bytes())
print(rank_server.handle(request, Forwarding())[0])
print("torch imported" if "torch" in sys.modules else "no torch")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert run.stdout.split() == ["call", "ok", "no", "torch"], run.stdout + run.stderr


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(params=["process", "served"])
def unwarmed(request: pytest.FixtureRequest) -> Iterator[ProcessLauncher | ServerLauncher]:
    """A launcher that has started no pool yet: in this process, or a worker's on a rank server of its own."""
    if request.param == "process":
        launcher: ProcessLauncher | ServerLauncher = ProcessLauncher(cpu(8), max_live_ranks=8)
        yield launcher
        launcher.close()
        return
    server = RankServer(cpu(8), max_live_ranks=8)
    launcher = ServerLauncher(server.address, binds_devices=False)
    yield launcher
    launcher.close()
    server.close()


def test_pools_warmed_ahead_serve_the_cases_that_need_them(unwarmed: ProcessLauncher | ServerLauncher) -> None:
    unwarmed.warm([2, 3, 2])
    deadline = time.monotonic() + 120
    while unwarmed.pools_started() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert unwarmed.pools_started() == 2  # before any case asked for ranks
    for size in (3, 2, 3):
        assert [o.value for o in unwarmed.run(RankTask(rank_cases.whoami, size), (), IMPL)] == [
            (rank, size, "process") for rank in range(size)]
        assert unwarmed.last_start_s == 0.0
    assert unwarmed.pools_started() == 2


def test_a_case_waits_for_its_pool_being_warmed_instead_of_starting_another() -> None:
    launcher = ProcessLauncher(cpu(8), max_live_ranks=8)
    try:
        launcher.warm([4])
        time.sleep(0.2)  # the warming has begun: its fork server takes seconds to import torch
        launcher.run(RankTask(rank_cases.pid, 4), (), IMPL)
        assert launcher.last_start_s > 0  # it waited for the pool's start
        assert launcher.pools_started() == 1
    finally:
        launcher.close()


def test_warming_stays_within_the_slots_and_the_live_rank_budget() -> None:
    launcher = ProcessLauncher(cpu(4), max_live_ranks=5)
    try:
        launcher.warm([8, 2, 4])  # 8: more than the slots; 4: beyond the budget once 2 is warm
        launcher.run(RankTask(rank_cases.pid, 2), (), IMPL)
        launcher.run(RankTask(rank_cases.pid, 4), (), IMPL)
        assert launcher.last_start_s > 0  # the case started its own pool: none of 4 was warmed
        assert launcher.pools_started() == 2
    finally:
        launcher.close()


def test_a_ranks_backward_thread_warns_logs_and_reduces_for_that_rank_only(launcher: Launcher) -> None:
    """Warnings and logs of the thread a rank's backward runs on are that rank's, never another thread rank's."""
    outcomes = launcher.run(RankTask(rank_cases.warns_from_its_backward, 3), (), IMPL)
    for rank, outcome in enumerate(outcomes):
        assert outcome.error is None, outcome.error.traceback  # type: ignore[union-attr]
        assert outcome.value == {"said": [f"rank {rank} logged from coc-backward", f"rank {rank} warned"],
                                 "total": 3.0}
        assert f"rank {rank} logged" in outcome.log
        assert all(f"rank {other} logged" not in outcome.log for other in range(3) if other != rank), outcome.log


def test_a_task_asking_for_fresh_ranks_runs_on_processes_that_ran_no_case(pool_launcher: Launcher) -> None:
    """Another launch of a case, as the deterministic checks ask: its ranks are new processes (what a process fixed
    at its first call is fixed anew), and they stay warm for the next case; threads cannot be fresh processes."""
    first = [o.value for o in pool_launcher.run(RankTask(rank_cases.pid, 2), (), IMPL)]
    assert [o.value for o in pool_launcher.run(RankTask(rank_cases.pid, 2), (), IMPL)] == first  # warm
    fresh = [o.value for o in pool_launcher.run(RankTask(rank_cases.pid, 2, fresh=True), (), IMPL)]
    assert not set(fresh) & set(first)
    assert [o.value for o in pool_launcher.run(RankTask(rank_cases.pid, 2), (), IMPL)] == fresh
    assert pool_launcher.relaunches and not ThreadedLauncher.relaunches


def test_naming_the_fork_servers_modules_never_waits_for_its_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's second worker names the modules (at the end of its collection) while a pool of the first waits
    for the fork server's imports: naming returns at once (it once waited for the imports, seconds on 2 cores)."""
    import subprocess

    from conformance.harness.launchers import zygote_client

    started = subprocess.Popen

    def still_importing(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:  # a server that never gets ready
        return started([sys.executable, "-c", "import time; time.sleep(30)"], **kwargs)

    monkeypatch.setattr(zygote_client.subprocess, "Popen", still_importing)
    zygote = zygote_client.Zygote(start_timeout_s=4.0)
    raised: list[BaseException] = []

    def pool_start() -> None:
        try:
            zygote.ready(("numpy",))
        except BaseException as exc:  # noqa: BLE001 - looked at below
            raised.append(exc)

    waiting = threading.Thread(target=pool_start)
    waiting.start()
    time.sleep(0.3)  # the pool's thread now waits for "ready"
    began = time.monotonic()
    zygote.begin(("numpy", "json"))
    named_in = time.monotonic() - began
    waiting.join()
    zygote.close()
    assert named_in < 1.0, f"naming the modules waited {named_in:.1f} s for the fork server's imports"
    assert len(raised) == 1 and isinstance(raised[0], RankCrashed)  # the server that never got ready is said so


@pytest.mark.parametrize(("users", "ranks"), [(None, "1"), ("3", "3")], ids=["unset", "the-users"])
def test_ranks_openmp_teams_take_the_ranks_threads_unless_the_user_said(monkeypatch: pytest.MonkeyPatch,
                                                                        users: str | None, ranks: str) -> None:
    """OpenMP sizes a thread's team by OMP_NUM_THREADS, read as the fork server imports torch: unset, a rank's device
    thread (its backward) took a team of a thread per core, spinning beside every other rank's."""
    import subprocess

    from conformance.harness.launchers import zygote_client

    started = subprocess.Popen
    environments: list[dict[str, str]] = []

    def recorded(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        environments.append(kwargs["env"])
        return started([sys.executable, "-c", "pass"], **kwargs)

    monkeypatch.setattr(zygote_client.subprocess, "Popen", recorded)
    if users is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", users)
    zygote_client.Zygote(threads=1).close()
    assert environments[0]["OMP_NUM_THREADS"] == ranks
