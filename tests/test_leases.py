"""Device leases: distinct devices, exclusivity across processes, preference, limits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.harness.leases import DeviceLeases, LeaseTimeout, LeaseUnsatisfiable

ROOT = Path(__file__).resolve().parents[1]


def _spawn(lease_dir: Path, devices: str, count: int, rounds: int, log: Path,
           exclusive: bool = False) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.lease_worker", str(lease_dir), devices, str(count),
            str(rounds), str(log)] + (["exclusive"] if exclusive else [])
    return subprocess.Popen(args, cwd=ROOT)


def _intervals(logs: list[Path]) -> list[tuple[float, float, set[str], str]]:
    found = []
    for log in logs:
        for line in log.read_text().splitlines():
            start, end, held = line.split()
            found.append((float(start), float(end), set(held.split(",")), log.name))
    return found


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
    with pytest.raises(LeaseUnsatisfiable, match="needs 8 devices but this node has 4"):
        with DeviceLeases(tmp_path, ["0", "1", "2", "3"]).lease(8):
            pass
