"""A stand-in for one pytest-xdist worker that leases devices in a loop.

``python -m tests.support.lease_worker LEASE_DIR DEVICES COUNT ROUNDS LOG [exclusive] [hold=S] [delay=S]``
appends one line per lease: ``asked start end device,device``, with times from
``time.monotonic`` (``hold``: seconds each lease is held; ``delay``: seconds
before the first request).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from conformance.harness.leases import DeviceLeases


def main(argv: list[str]) -> None:
    lease_dir, devices, count, rounds, log = argv[:5]
    options = dict(arg.split("=", 1) for arg in argv[5:] if "=" in arg)
    exclusive = "exclusive" in argv[5:]
    hold, delay = float(options.get("hold", 0.01)), float(options.get("delay", 0))
    leases = DeviceLeases(Path(lease_dir), devices.split(","), wait_s=60)
    time.sleep(delay)
    lines = []
    for _ in range(int(rounds)):
        asked = time.monotonic()
        with leases.lease(int(count), exclusive=exclusive) as held:
            start = time.monotonic()
            time.sleep(hold)
            lines.append(f"{asked} {start} {time.monotonic()} {','.join(held)}")
    Path(log).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
