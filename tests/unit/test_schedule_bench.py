"""The schedule simulation (``python -m conformance.bench schedule``, docs/DESIGN.md#scheduling): a recorded
run replayed through the suite's order and the one lease rule, judged on the returned schedule."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.bench import lease_simulation, recorded_run, schedule
from conformance.bench.__main__ import BENCHMARKS
from conformance.bench.__main__ import main as bench_main
from conformance.caseids import Needs
from conformance.harness import leases
from conformance.plugins import scheduling


def _record(case: str, duration: float, world: int = 0, *, exclusive: bool = False, rank_s: float = 0.0,
            pool_start: float = 0.0, lease_wait: float = 0.0, pools_started: int = 0) -> dict[str, Any]:
    """A summary record as the suite writes it; ``world=0`` and no ``rank_s``: a case without timings."""
    record: dict[str, Any] = {"id": case, "outcome": "passed", "when": "call", "duration": duration}
    if world or rank_s:
        ranks = rank_s + pool_start
        record["timings"] = {"lease_wait": lease_wait, "pool_start": pool_start, "pools_started": pools_started,
                             "ranks": ranks, "runs": 1, "total": duration, "world": world, "exclusive": exclusive}
    return record


def _case(name: str, world: int, rank_s: float, *, exclusive: bool = False, worker_s: float = 0.0) -> recorded_run.Case:
    return recorded_run.Case(name, world, exclusive, rank_s, worker_s)


def test_record_splits_rank_worker_and_pool_start_time() -> None:
    recording = recorded_run.read_summary({"cases": [
        _record("a", 10.0, 2, rank_s=3.0, pool_start=5.0, lease_wait=1.5, pools_started=1),
        _record("b", 0.5),
        _record("p", 4.0, 2, exclusive=True, rank_s=4.0, pool_start=1.0, pools_started=1),  # floored at 0
    ]})
    a, b, p = recording.cases
    assert (a.world, a.rank_s, a.worker_s) == (2, pytest.approx(3.0), pytest.approx(0.5))
    assert (b.world, b.rank_s, b.worker_s) == (0, 0.0, 0.5)
    assert (p.exclusive, p.rank_s, p.worker_s) == (True, pytest.approx(4.0), 0.0)
    assert (recording.pool_start_s, recording.pools_started, recording.mean_pool_start) == (6.0, 2, 3.0)


def test_timings_without_world_are_refused() -> None:
    record = _record("old", 1.0, 2, rank_s=1.0)
    del record["timings"]["world"]
    with pytest.raises(recorded_run.SummaryError, match="old.*no world"):
        recorded_run.read_summary({"cases": [record]})


def test_one_rank_cases_fill_the_slots_exactly() -> None:
    cases = [_case(f"c{i}", 1, 1.0) for i in range(16)]
    result = lease_simulation.simulate(cases, slots=2, workers=2)
    assert len(result.runs) == 16 and result.unschedulable == ()
    assert result.lower_bound == pytest.approx(8.0)
    assert result.makespan == pytest.approx(result.lower_bound)
    assert result.utilisation == pytest.approx(1.0)
    assert result.lease_wait == 0.0


def test_a_waiting_request_looks_again_sooner_then_at_most_every_poll_max() -> None:
    assert leases.next_poll(0.0) == 0.0  # it looks when it asks
    assert leases.next_poll(leases.POLL_MIN_S) == pytest.approx(leases.POLL_MIN_S)
    late = leases.next_poll(10.0)
    assert 10.0 <= late <= 10.0 + leases.POLL_MAX_S


def test_pool_start_is_paid_once() -> None:
    result = lease_simulation.simulate([_case(f"c{i}", 1, 1.0) for i in range(4)], slots=2, workers=2, pool_start=2.5)
    assert (result.makespan, result.lower_bound) == (pytest.approx(4.5), pytest.approx(4.5))


def test_worker_time_comes_before_the_lease_and_holds_no_slots() -> None:
    # Two workers, one slot: while one case holds the slot, the other's worker time runs beside it.
    result = lease_simulation.simulate([_case("a", 1, 2.0, worker_s=1.0), _case("b", 1, 2.0, worker_s=1.0)],
                               slots=1, workers=2)
    runs = {r.id: r for r in result.runs}
    assert (runs["a"].asked, runs["a"].granted, runs["a"].end) == (1.0, 1.0, 3.0)
    polled = 1.0 + leases.next_poll(2.0)  # b sees the slot free at its next poll of the queue
    assert (runs["b"].asked, runs["b"].granted, runs["b"].end) == (1.0, polled, polled + 2.0)
    assert 2.0 < result.longest_lease_wait <= 2.0 + leases.POLL_MAX_S
    assert result.lower_bound == pytest.approx(4.0)  # Σ world × rank / slots; worker time is not slot time


def test_whole_node_case_among_small_ones_is_served_within_patience() -> None:
    # Small cases of staggered lengths keep the slots busy; the whole-node case asks early, waits its patience,
    # then the node drains for it.
    small = [_case(f"s{i}", 1, 1.0 + 0.25 * (i % 4)) for i in range(24)]
    cases = [*small[:4], _case("node", 2, 1.0, exclusive=True), *small[4:]]
    result = lease_simulation.simulate(cases, slots=4, workers=5)
    node = next(r for r in result.runs if r.id == "node")
    assert node.asked == 0.0
    assert leases.PATIENCE_S <= node.lease_wait <= leases.PATIENCE_S + 1.75
    holders = [r for r in result.runs if r.id != "node" and r.granted < node.end and r.end > node.granted]
    assert holders == []  # it held the whole node
    assert len(result.runs) == 25
    assert result.makespan <= result.lower_bound + leases.PATIENCE_S


def test_exclusive_case_counts_as_holding_every_slot_in_the_held_bound() -> None:
    cases = [*(_case(f"s{i}", 1, 1.0) for i in range(4)), _case("perf", 1, 4.0, exclusive=True)]
    result = lease_simulation.simulate(cases, slots=4, workers=4)
    assert (result.slot_seconds, result.held_slot_seconds) == (pytest.approx(8.0), pytest.approx(20.0))
    assert (result.lower_bound, result.held_bound) == (pytest.approx(4.0), pytest.approx(5.0))
    assert result.makespan == pytest.approx(result.held_bound)


def test_case_larger_than_the_node_is_reported_not_simulated() -> None:
    result = lease_simulation.simulate([_case("big", 8, 1.0), _case("small", 2, 1.0)], slots=4, workers=2)
    assert result.unschedulable == ("big",)
    assert [r.id for r in result.runs] == ["small"]
    assert result.slot_seconds == pytest.approx(2.0)


def test_simulation_grants_through_the_lease_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    rule = leases.next_grant

    def spy(queue: Any, free: int, now: float) -> leases.Request | None:
        calls.append((len(queue), free))
        return rule(queue, free, now)

    monkeypatch.setattr(leases, "next_grant", spy)
    lease_simulation.simulate([_case(f"c{i}", 1, 1.0) for i in range(3)], slots=1, workers=3)
    assert (1, 1) in calls and any(waiting > 1 for waiting, _ in calls)


def test_replay_orders_as_the_suite_through_one_key(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Needs] = []
    key = scheduling.rank_order

    def spy(need: Needs) -> tuple[bool, int, int]:
        seen.append(need)
        return key(need)

    monkeypatch.setattr(scheduling, "rank_order", spy)
    recording = recorded_run.read_summary({"cases": [
        _record("perf", 1.0, 2, exclusive=True, rank_s=1.0), _record("tp4", 1.0, 4, rank_s=1.0),
        _record("plain-1", 0.1), _record("tp2", 1.0, 2, rank_s=1.0), _record("plain-2", 0.1)]})
    assert [c.id for c in schedule.suite_order(recording.cases)] == ["plain-1", "plain-2", "tp2", "tp4", "perf"]
    assert sorted(n.world for n in seen) == [2, 2, 4]
    item = SimpleNamespace(callspec=SimpleNamespace(params={"tp": 2, "world": 4}),
                           get_closest_marker=lambda name: None)
    seen.clear()
    assert scheduling.order(item) == (False, 4, 2)  # type: ignore[arg-type]
    assert seen == [Needs(frozenset({2}), 4, False)]


def test_cli_prints_a_row_per_pair_and_a_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "coc-summary.json"
    summary.write_text(json.dumps({"cases": [
        *(_record(f"c{i}", 1.0, 1, rank_s=1.0) for i in range(8)),
        _record("first", 2.0, 2, rank_s=1.0, pool_start=1.0, pools_started=1),
        _record("tp8", 1.0, 8, rank_s=1.0)]}))
    assert "schedule" in BENCHMARKS
    assert bench_main(["schedule", "--summary", str(summary), "--slots", "2", "8", "--workers", "2", "4"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = out["rows"]
    assert [(r["slots"], r["workers"]) for r in rows] == [(2, 2), (2, 4), (8, 2), (8, 4)]
    assert [r["unschedulable"] for r in rows] == [1, 1, 0, 0]
    assert out["recorded_pools_started"] == 1
    assert all(r["makespan"] >= r["lower_bound"] - 1e-3 for r in rows)
    wider = schedule.replay(recorded_run.load(summary), 8, 4)
    assert rows[-1]["makespan"] == round(wider.makespan, 3) and wider.pool_start == 1.0


def test_cli_refuses_what_it_cannot_replay(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(SystemExit):
        schedule.main(["--summary", str(missing)])
    summary = tmp_path / "s.json"
    summary.write_text(json.dumps({"cases": []}))
    with pytest.raises(SystemExit):
        schedule.main(["--summary", str(summary), "--slots", "0"])


def _clocked(case: str, worker: str, start: float, duration: float, world: int = 0, rank_s: float = 0.0,
             cpu: float = 0.0, process_cpu: float = 0.0, **timings: float) -> dict[str, Any]:
    """A summary record with its clock (``coc_clock``): its worker, its start (epoch s) and its worker's CPU."""
    record = _record(case, duration, world, rank_s=rank_s)
    record["clock"] = {"worker": worker, "process_started": 90.0, "start": start, "cpu": cpu,
                       "process_cpu": process_cpu}
    if "timings" in record:
        record["timings"].update(timings)
    return record


def _clocked_run() -> dict[str, Any]:
    """Two workers: gw0 runs a (2 s of ranks) then b; gw1 runs c; the session ends at 112 s."""
    return {"process_started": 100.0, "started": 101.0, "duration": 11.0, "cases": [
        _clocked("a", "gw0", 104.0, 3.0, 2, rank_s=2.0, cpu=0.2, process_cpu=2.5, rank_cpu=1.0, rank_cpu_max=0.6),
        _clocked("b", "gw0", 108.0, 1.0, cpu=0.5, process_cpu=2.7),
        _clocked("c", "gw1", 106.0, 2.0, 2, rank_s=1.5, cpu=0.1, process_cpu=3.5, rank_cpu=0.8, rank_cpu_max=0.4)]}


def test_a_cases_worker_time_is_all_its_worker_did_until_the_next_case_and_start_up_is_recorded() -> None:
    """From the clocks: a case's worker time runs from its start to the next case's on its worker (the last to the
    session's end), its rank runs and lease waits left out; start-up is the session's process start to each
    worker's first case (mean), on free cores the session's start-up and each worker's CPU until its first case."""
    recording = recorded_run.read_summary(_clocked_run())
    a, b, c = recording.cases
    assert (a.rank_s, a.worker_s) == (pytest.approx(2.0), pytest.approx(2.0))  # 108 - 104 - 2 s of ranks
    assert b.worker_s == pytest.approx(4.0)  # to the session's end, 112 s
    assert (c.rank_s, c.worker_s) == (pytest.approx(1.5), pytest.approx(4.5))  # 112 - 106 - 1.5
    assert (recording.workers, recording.startup_s) == (2, pytest.approx(5.0))  # (4 + 6) / 2
    assert recording.worker_startups == (pytest.approx(4.0), pytest.approx(6.0))
    assert recording.startup_cpu_s == pytest.approx(1.0 + 3.0)  # 101 - 100, then (2.5 + 3.5) / 2
    assert (a.busiest_cpu_s, a.rank_cpu_s, a.worker_cpu_s) == (0.6, 1.0, 0.2)


def test_workers_start_after_the_start_up_and_the_process_exits_after_the_last_case() -> None:
    result = lease_simulation.simulate([_case("a", 1, 1.0), _case("b", 1, 1.0)], slots=1, workers=2, startup=5.0,
                               exit_s=1.5)
    b_end = 5.0 + leases.next_poll(1.0) + 1.0
    assert [(r.id, r.asked, r.end) for r in result.runs] == [("a", 5.0, 6.0), ("b", 5.0, b_end)]
    assert result.makespan == pytest.approx(b_end + 1.5)
    assert result.lower_bound == pytest.approx(5.0 + 2.0 + 1.5)


def test_replay_of_the_recording_node_reproduces_its_wall_and_the_cpu_basis_gives_a_free_core_to_each() -> None:
    recording = recorded_run.read_summary(_clocked_run())
    # In the suite's order (b without ranks first, then a and c), each worker starting when it did (4 s and 6 s after
    # the process): the first runs b (4 s) then c (4.5 s, 1.5 s of ranks), the second a beside b.
    recorded = schedule.replay(recording, slots=2, workers=2, exit_s=0.0)
    assert recorded.predicted == pytest.approx(4.0 + 4.0 + 4.5 + 1.5)
    assert schedule.replay(recording, slots=2, workers=1, exit_s=0.0).startup == pytest.approx(5.0)  # the mean
    free = schedule.replay(recording, slots=2, workers=2, exit_s=0.0, basis="cpu", cores=1)
    # b 0.5 s then c: 0.1 s on its worker, its lease waits for a's (0.2 + 0.6 s) until its next poll, then 0.4 s
    assert free.makespan == pytest.approx(4.0 + 0.6 + leases.next_poll(0.8 - 0.6) + 0.4)
    assert free.cpu_bound == pytest.approx(4.0 + (1.0 + 0.2 + 0.5 + 0.8 + 0.1) / 1)
    assert free.predicted == free.cpu_bound  # one core: the cores, not the schedule, limit it


def test_cli_says_each_rows_error_against_the_measured_wall(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "coc-summary.json"
    summary.write_text(json.dumps(_clocked_run()))
    assert schedule.main(["--summary", str(summary), "--slots", "2", "--workers", "2", "--exit-s", "0",
                          "--measured", "10"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].rstrip().endswith("+40.0%")  # 14 s predicted against 10 s measured
    assert json.loads(out[-1])["rows"][0]["predicted"] == pytest.approx(14.0)
