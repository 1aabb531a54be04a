"""A stand-in for one pytest-xdist worker that leases devices in a loop.

``python -m tests.lease_worker LEASE_DIR DEVICES COUNT ROUNDS LOG [exclusive]`` appends one
line per lease: ``start end device,device``, with times from ``time.monotonic``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from conformance.harness.leases import DeviceLeases


def main(argv: list[str]) -> None:
    lease_dir, devices, count, rounds, log = argv[:5]
    exclusive = len(argv) > 5 and argv[5] == "exclusive"
    leases = DeviceLeases(Path(lease_dir), devices.split(","), wait_s=60)
    lines = []
    for _ in range(int(rounds)):
        with leases.lease(int(count), exclusive=exclusive) as held:
            start = time.monotonic()
            time.sleep(0.01)
            lines.append(f"{start} {time.monotonic()} {','.join(held)}")
    Path(log).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
