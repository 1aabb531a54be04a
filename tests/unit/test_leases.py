"""Device leases: distinct devices, exclusivity across processes, preference, limits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.harness.leases import (
    PATIENCE_S,
    DeviceLeases,
    LeaseTimeout,
    LeaseUnsatisfiable,
    Request,
    next_grant,
)
from tests.support import ROOT


def _spawn(lease_dir: Path, devices: str, count: int, rounds: int, log: Path,
           exclusive: bool = False, **options: float) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.support.lease_worker", str(lease_dir), devices, str(count),
            str(rounds), str(log)] + (["exclusive"] if exclusive else []) + [f"{k}={v}" for k, v in options.items()]
    return subprocess.Popen(args, cwd=ROOT)


def _intervals(logs: list[Path]) -> list[tuple[float, float, set[str], str]]:
    found = []
    for log in logs:
        for line in log.read_text().splitlines():
            _, start, end, held = line.split()
            found.append((float(start), float(end), set(held.split(",")), log.name))
    return found


def _waits(log: Path) -> list[float]:
    rows = (line.split() for line in log.read_text().splitlines())
    return [float(start) - float(asked) for asked, start, _, _ in rows]


def test_workers_never_hold_the_same_device_at_once(tmp_path: Path) -> None:
    logs = [tmp_path / f"worker-{i}.log" for i in range(4)]
    # Four "xdist workers" on a 4-device node: three want 2 devices, one wants all of them.
    procs = [_spawn(tmp_path / "leases", "0,1,2,3", 2, 25, log) for log in logs[:3]]
    procs.append(_spawn(tmp_path / "leases", "0,1,2,3", 0, 10, logs[3], exclusive=True))
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    intervals = _intervals(logs)
    assert len(intervals) == 3 * 25 + 10
    for _, _, held, who in intervals:
        assert len(held) == (4 if who == logs[3].name else 2)
    for i, (s1, e1, d1, w1) in enumerate(intervals):
        for s2, e2, d2, w2 in intervals[i + 1:]:
            if d1 & d2:
                assert e1 <= s2 or e2 <= s1, f"{w1} and {w2} both held {d1 & d2}"


def test_lease_prefers_given_devices_and_releases(tmp_path: Path) -> None:
    leases = DeviceLeases(tmp_path, ["0", "1", "2", "3"])
    with leases.lease(2, prefer=["3", "1"]) as held:
        assert held == ("3", "1")
        with leases.lease(2) as other:
            assert set(other) == {"0", "2"}
    with leases.lease(4) as everything:
        assert set(everything) == {"0", "1", "2", "3"}


def test_exclusive_waits_for_all_devices(tmp_path: Path) -> None:
    leases = DeviceLeases(tmp_path, ["0", "1"], wait_s=0.3)
    with leases.lease(1), pytest.raises(LeaseTimeout), leases.lease(0, exclusive=True):
        pass


def test_more_devices_than_the_node_has_is_an_error(tmp_path: Path) -> None:
    """A request that can never be granted fails at once, as such (not as a timeout)."""
    with pytest.raises(LeaseUnsatisfiable, match="needs 8 devices, this node has 4"):
        with DeviceLeases(tmp_path, ["0", "1", "2", "3"]).lease(8):
            pass


def test_an_exclusive_request_for_more_ranks_than_devices_is_an_error(tmp_path: Path) -> None:
    """Holding the whole node of one device never lets two ranks start on it."""
    with pytest.raises(LeaseUnsatisfiable, match="needs 2 devices, this node has 1"):
        with DeviceLeases(tmp_path, ["0"]).lease(2, exclusive=True):
            pass


def test_a_whole_node_request_is_not_starved_by_small_ones(tmp_path: Path) -> None:
    """Four workers keep all 8 devices busy with 2-device leases; one asks for the whole node.

    Small requests that fit go first, but once the big one has waited
    :data:`PATIENCE_S` the node drains for it: it waits about that plus the
    leases running then (0.1 s each here), never until the small workers run
    out of work (about 6 s at least, and longer on a loaded machine).
    """
    logs = [tmp_path / f"small-{i}.log" for i in range(4)]
    procs = [_spawn(tmp_path / "leases", "0,1,2,3,4,5,6,7", 2, 60, log, hold=0.1) for log in logs]
    big = tmp_path / "big.log"
    procs.append(_spawn(tmp_path / "leases", "0,1,2,3,4,5,6,7", 0, 3, big, exclusive=True, hold=0.05, delay=1.0))
    assert [p.wait(timeout=120) for p in procs] == [0] * 5
    waits = _waits(big)
    small = [line.split() for log in logs for line in log.read_text().splitlines()]
    small_start, small_end = min(float(row[1]) for row in small), max(float(row[2]) for row in small)
    span = small_end - small_start
    print(f"whole-node request waited {[round(w, 3) for w in waits]} s behind 2-device leases held 0.1 s; "
          f"the small workers ran {span:.1f} s")
    assert len(waits) == 3 and max(waits) < PATIENCE_S + 1.0 + span / 10, (waits, span)
    assert max(float(line.split()[2]) for line in big.read_text().splitlines()) < small_end, \
        "the whole-node request was served only once the small workers ran out of work"


def _queue(*wanted_and_age: tuple[int, float]) -> list[Request]:
    return [Request(ticket, wanted, 100.0 - age) for ticket, (wanted, age) in enumerate(wanted_and_age)]


def test_the_largest_request_that_fits_goes_first_and_the_oldest_of_equals() -> None:
    queue = _queue((8, 1.0), (2, 0.9), (4, 0.8), (4, 0.7), (1, 0.6))
    assert next_grant(queue, 5, 100.0) == queue[2], "the largest that fits (4 of 5), the older of two"
    assert next_grant(queue, 8, 100.0) == queue[0], "a drained node serves the whole-node request"
    assert next_grant(queue, 1, 100.0) == queue[4]
    assert next_grant(queue, 0, 100.0) is None
    assert next_grant([], 8, 100.0) is None


def test_once_the_oldest_has_waited_its_patience_only_it_may_go() -> None:
    queue = _queue((8, PATIENCE_S), (2, 0.5), (1, 0.1))
    assert next_grant(queue, 6, 100.0) is None, "the node drains for the patient request"
    assert next_grant(queue, 8, 100.0) == queue[0]
    young = _queue((8, PATIENCE_S / 2), (2, 0.5))
    assert next_grant(young, 6, 100.0) == young[1], "before its patience, smaller requests fill the devices"


def test_a_dead_workers_lease_and_ticket_are_released(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from conformance.harness.leases import DeviceLeases\n"
        "leases = DeviceLeases(Path(sys.argv[1]), ['0', '1'])\n"
        "with leases.lease(2):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with DeviceLeases(tmp_path, ["0", "1"], wait_s=5).lease(2) as held:
        assert set(held) == {"0", "1"}
