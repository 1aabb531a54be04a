"""``torchrun -m pytest``: every rank runs the session, and a hang leaves every rank's stacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_torchrun_every_rank_runs_the_session(tmp_path: Path) -> None:
    """``torchrun -m pytest``: each rank runs the session; cases of another world size are deselected."""
    (tmp_path / "test_under_torchrun.py").write_text(
        "import pytest\n"
        "from tests.support import rank_cases\n"
        "@pytest.mark.parametrize('world_size', [1, 2, 4])\n"
        "def test_sum(coc_ranks, world_size):\n"
        "    assert coc_ranks.run(rank_cases.rank_sum, world_size) == [[1.0] * 4] * 2\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conformance.plugin", "-p", "no:xdist",
         "--coc-launcher", "torchrun", "--rootdir", str(tmp_path), str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("1 passed, 2 deselected") == 2, result.stdout


def test_a_hang_under_torchrun_leaves_every_rank_stacks(tmp_path: Path) -> None:
    """The job aborts at the case's ceiling, and each rank's stacks are in the file the header names."""
    (tmp_path / "test_hang_under_torchrun.py").write_text(
        "import time\n"
        "def sleep_on_rank(ctx):\n"
        "    time.sleep(120)\n"
        "def test_hang(coc_ranks):\n"
        "    coc_ranks.run(sleep_on_rank, 2, timeout=3)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "pytest", "-p", "no:cacheprovider", "-p", "conformance.plugin", "-p", "no:xdist",
         "--coc-launcher", "torchrun", "--rootdir", str(tmp_path), str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert f"stacks go to {tmp_path / 'coc-torchrun-rank<rank>.stacks'}" in result.stdout, result.stdout[-2000:]
    # The first rank to time out ends the job (torchrun then stops the other): its dump is complete.
    dumps = [path.read_text() for path in tmp_path.glob("coc-torchrun-rank*.stacks")]
    assert any("Timeout" in d and "sleep_on_rank" in d and "test_hang_under_torchrun.py" in d for d in dumps), dumps
