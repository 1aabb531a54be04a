"""The names of what a perf case times: the rank side measures items under these names, the judge reads them."""

from __future__ import annotations

#: Item names reserved by the protocol (everything else is a CoC variant).
SERIAL, MM, COMM = "serial", "mm", "comm"
#: The reference row of the serial composition into persistent buffers (not a CoC variant).
SERIAL_REUSED = "serial-reused"


def block_key(what: str, rows: int) -> str:
    """Item name of the matmul (``mm``) or collective (``comm``) of one block of ``rows`` rows."""
    return f"{what}@{rows}"
