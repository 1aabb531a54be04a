"""What the tests share: implementations with faults and without, rank tasks, pools, the checkout's root."""

from pathlib import Path

#: The checkout's root directory.
ROOT = Path(__file__).resolve().parents[2]
