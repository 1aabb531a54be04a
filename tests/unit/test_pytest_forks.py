"""The fork server of the suite runs (tests/support/pytest_forks.py): a forked session is what a fresh
``python -m pytest`` would be -- its arguments, directory, environment, import path, output, exit status and
assertion rewriting -- or, where it could not be, a fresh process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pytest_forks import PytestForks

#: A test module that reports what its process looks like, and fails with a rewritten assertion.
PROBE = """
import os, sys

def test_where():
    print("ARGV0", os.path.basename(sys.argv[0]))
    print("CWD", os.getcwd())
    print("PATH0", sys.path[0])
    print("MARK", os.environ.get("COC_FORK_MARK"))
    print("MAIN", sys.modules["__main__"].__spec__.name)

def test_rewritten():
    left = [1, 2]
    assert left == [1, 3]
"""


@pytest.fixture(scope="module")
def forks() -> Iterator[PytestForks]:
    server = PytestForks()
    yield server
    server.close()


def _run(pytester: pytest.Pytester, forks: PytestForks | None) -> pytest.RunResult:
    pytester.makepyfile(test_probe=PROBE)
    args = ("-p", "no:cacheprovider", "-s", "-p", "no:conformance.plugin")
    return forks.runpytest(pytester, *args) if forks else pytester.runpytest_subprocess(*args)


def test_a_forked_session_is_what_a_fresh_process_would_be(pytester: pytest.Pytester, forks: PytestForks,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COC_FORK_MARK", "seen")
    fresh = _run(pytester, None)
    capsys.readouterr()
    forked = _run(pytester, forks)
    assert "running (forked)" in capsys.readouterr().out
    for result in (fresh, forked):
        result.assert_outcomes(passed=1, failed=1)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*ARGV0 __main__.py", f"CWD {pytester.path}", f"PATH0 {pytester.path}",
                                     "MARK seen", "MAIN pytest.__main__"])
        assert "E       assert [1, 2] == [1, 3]" in result.stdout.str()  # rewritten: the values are shown


def test_a_run_with_other_start_up_settings_is_left_to_a_fresh_process(forks: PytestForks) -> None:
    assert forks.forks(dict(os.environ))
    assert not forks.forks({**os.environ, "PYTHONHASHSEED": "12345"})
    assert not forks.forks({**os.environ, "OMP_NUM_THREADS": "7"})
    assert forks.forks({**os.environ, "PYTHONPATH": "/elsewhere", "COC_GOLDEN_DIR": "/elsewhere"})


def test_a_forked_session_past_its_timeout_is_killed(pytester: pytest.Pytester, forks: PytestForks) -> None:
    pid_file = pytester.path / "pid"
    pytester.makepyfile(test_sleeps=f"import os, time\ndef test_sleeps():\n"
                                    f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    time.sleep(60)\n")
    with pytest.raises(pytester.TimeoutExpired):
        forks.runpytest(pytester, "-p", "no:cacheprovider", timeout=2)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:  # killed, then reaped by its server
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), f"the forked session {pid} still runs past its timeout"
